/*
 * Test harness for spank/sg_bind.c (tests/unit/spank/test_spank_cbind.py): loads
 * a binding table the way the plugin names and checks it, binds one task
 * with fake system calls, and prints what the plugin would have done.
 *
 *   harness DIR PREFIX NODE CONFIG GRES STEP CVD PER TASK NTASKS ALLOWED BOUND
 *           SETAFFINITY_ERRNO SET_MEMPOLICY_ERRNO
 *
 * "@unset" stands for an unset variable; ALLOWED and BOUND are cpu lists
 * (BOUND "@none": no MPOL_BIND policy in place).
 *
 * Linked with --wrap=malloc,calloc,realloc: on stderr it says the largest
 * single allocation sg_table_load made ("load-maxalloc N"), which must
 * follow the table's size, not the reader's limits.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sg_bind.h"

static size_t maxalloc;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);

static void note(size_t n)
{
    if (n > maxalloc)
        maxalloc = n;
}

void *__wrap_malloc(size_t n)
{
    note(n);
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    note(n * size);
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    note(n);
    return __real_realloc(p, n);
}

static const char *allowed_text, *bound_text;
static int aff_err, mpol_err;

static void set_list(unsigned char *bits, const char *text)
{
    char *copy = strdup(text), *tok, *save = NULL;
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int lo = atoi(tok), hi = strchr(tok, '-') ? atoi(strchr(tok, '-') + 1) : lo;
        for (; lo <= hi; lo++)
            bits[lo / 8] |= (unsigned char) (1u << (lo % 8));
    }
    free(copy);
}

static void print_list(const char *what, const unsigned char *bits, int nbits)
{
    int i, first = 1;
    printf("%s ", what);
    for (i = 0; i < nbits; i++)
        if (bits[i / 8] >> (i % 8) & 1) {
            printf(first ? "%d" : ",%d", i);
            first = 0;
        }
    printf("\n");
}

static int f_getaffinity(unsigned char *bits)
{
    set_list(bits, allowed_text);
    return 0;
}

static int f_get_mempolicy(int *mode, unsigned char *bits)
{
    if (strcmp(bound_text, "@none") == 0) {
        *mode = 0;
        return 0;
    }
    *mode = 2;
    set_list(bits, bound_text);
    return 0;
}

static int f_setaffinity(const unsigned char *bits)
{
    print_list("affinity", bits, SG_BIND_MAXID + 1);
    return aff_err;
}

static int f_set_mempolicy(int mode, const unsigned long *mask, unsigned long maxnode)
{
    int i, first = 1, per = (int) (8 * sizeof(unsigned long));
    printf("mempolicy %d %lu ", mode, maxnode);
    for (i = 0; i < (int) maxnode - 1; i++)
        if (mask[i / per] >> (i % per) & 1) {
            printf(first ? "%d" : ",%d", i);
            first = 0;
        }
    printf("\n");
    return mpol_err;
}

static int f_setenv(void *ctx, const char *name, const char *value)
{
    (void) ctx;
    printf("setenv %s=%s\n", name, value);
    return 0;
}

static const char *f_setenv_error(void *ctx)
{
    (void) ctx;
    return "?";
}

static void f_error(const char *line)
{
    printf("error %s\n", line);
}

static void f_say(const char *line)
{
    printf("say %s", line);
}

static const char *arg(const char *a)
{
    return strcmp(a, "@unset") == 0 ? NULL : a;
}

int main(int argc, char **argv)
{
    struct sg_table t;
    struct sg_task_in in;
    struct sg_ops ops = { f_getaffinity, f_get_mempolicy, f_setaffinity, f_set_mempolicy,
                          f_setenv, f_setenv_error, f_error, f_say, NULL };
    char key[8192], name[512];
    int rc;
    if (argc != 15)
        return 2;
    if (sg_table_name(argv[2], argv[3], argv[4], argv[5], key, sizeof(key), name, sizeof(name))) {
        printf("name refused\n");
        return 0;
    }
    printf("name %s\n", name);
    maxalloc = 0;
    if (sg_table_load(&t, argv[1], name, key)) {
        printf("load refused\n");
        return 0;
    }
    fprintf(stderr, "load-maxalloc %zu\n", maxalloc);
    memset(&in, 0, sizeof(in));
    in.step_gpus = arg(argv[6]);
    in.cvd = arg(argv[7]);
    in.per_task = arg(argv[8]);
    in.task = atoi(argv[9]);
    in.ntasks = (unsigned) atoi(argv[10]);
    allowed_text = argv[11];
    bound_text = argv[12];
    aff_err = atoi(argv[13]);
    mpol_err = atoi(argv[14]);
    rc = sg_bind_task(&t, &in, &ops);
    printf("rc %d\n", rc);
    sg_table_free(&t);
    return 0;
}
