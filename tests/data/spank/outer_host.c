/*
 * A stand-in for srun that loads the plugin's OUTER half through a path the
 * test gives (a venv link), registers its options with stub SPANK
 * functions, waits for a line on stdin (the test swaps the link meanwhile),
 * then sets an option value that needs Python, so the outer half loads its
 * inner half.  (Written for slurm-gpu's tests.)
 *
 *   outer_host OUTER.so OPTION VALUE
 * Prints LOADED, then whatever the inner half and slurm_error say.
 */
#include <slurm/spank.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static struct spank_option opts[32];
static int nopts;

void slurm_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("ERROR ");
    vprintf(fmt, ap);
    putchar('\n');
    fflush(stdout);
    va_end(ap);
}
spank_context_t spank_context(void) { return S_CTX_LOCAL; }
const char *spank_strerror(spank_err_t e) { (void) e; return "stub error"; }
spank_err_t spank_get_item(spank_t s, spank_item_t i, ...) { (void) s; (void) i; return ESPANK_ERROR; }
spank_err_t spank_getenv(spank_t s, const char *v, char *b, int l) { (void) s; (void) v; (void) b; (void) l; return ESPANK_ENV_NOEXIST; }
spank_err_t spank_setenv(spank_t s, const char *v, const char *x, int o) { (void) s; (void) v; (void) x; (void) o; return ESPANK_SUCCESS; }
spank_err_t spank_job_control_setenv(spank_t s, const char *n, const char *v, int o) { (void) s; (void) n; (void) v; (void) o; return ESPANK_SUCCESS; }
spank_err_t spank_option_register(spank_t s, struct spank_option *o)
{
    (void) s;
    if (nopts < 32)
        opts[nopts++] = *o;
    return ESPANK_SUCCESS;
}

int main(int argc, char **argv)
{
    char line[16];
    int (*init)(spank_t, int, char **);
    int i;
    void *h;
    if (argc != 4)
        return 2;
    h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("DLOPEN %s\n", dlerror());
        return 2;
    }
    init = (int (*)(spank_t, int, char **)) dlsym(h, "slurm_spank_init");
    if (!init || init(NULL, 0, NULL) != 0)
        return 2;
    printf("LOADED\n");
    fflush(stdout);
    if (!fgets(line, sizeof(line), stdin))
        return 2;
    for (i = 0; i < nopts; i++)
        if (strcmp(opts[i].name, argv[2]) == 0) {
            printf("OPTION %d\n", opts[i].cb(opts[i].val, argv[3], 0));
            return 0;
        }
    printf("NO OPTION %s\n", argv[2]);
    return 1;
}
