/*
 * A stand-in for srun that loads the plugin's inner half the way the outer
 * half does, with stub SPANK functions, so tests can check the embedded
 * interpreter without a cluster.  (Written for slurm-gpu's tests.)
 *
 *   embed_host INNER.so V0 V1 V2 V3 [PYCODE]
 * Vn: value of option n ("-" = not given).  Prints one line per event.
 */
#include <slurm/spank.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *vals[4];
static const char *option_value(int w) { return (w >= 0 && w < 4) ? vals[w] : NULL; }
/* spank/sg_api.h: what the outer half hands over, its plugstack arguments
 * parsed (as "config=/etc/slurm-gpu/embed.toml numa_bind=prefer,verbose") */
struct sg_args { const char *config; const char *numa_mode; int numa_verbose; int bad; };
static const struct sg_args args = { "/etc/slurm-gpu/embed.toml", "prefer", 1, 0 };
struct sg_outer_api { int version; const char *(*option_value)(int); const struct sg_args *args; };
static const struct sg_outer_api api = { 2, option_value, &args };

static void say(const char *tag, const char *fmt, va_list ap)
{
    printf("%s ", tag);
    vprintf(fmt, ap);
    putchar('\n');
    fflush(stdout);
}
void slurm_error(const char *fmt, ...) { va_list ap; va_start(ap, fmt); say("ERROR", fmt, ap); va_end(ap); }
void slurm_info(const char *fmt, ...) { va_list ap; va_start(ap, fmt); say("INFO", fmt, ap); va_end(ap); }
void slurm_verbose(const char *fmt, ...) { va_list ap; va_start(ap, fmt); say("VERBOSE", fmt, ap); va_end(ap); }
void slurm_debug(const char *fmt, ...) { va_list ap; va_start(ap, fmt); say("DEBUG", fmt, ap); va_end(ap); }
spank_context_t spank_context(void) { return S_CTX_LOCAL; }
const char *spank_strerror(spank_err_t e) { (void) e; return "stub error"; }
spank_err_t spank_get_item(spank_t s, spank_item_t i, ...) { (void) s; (void) i; return ESPANK_ERROR; }
spank_err_t spank_getenv(spank_t s, const char *v, char *b, int l) { (void) s; (void) v; (void) b; (void) l; return ESPANK_ENV_NOEXIST; }
spank_err_t spank_setenv(spank_t s, const char *v, const char *x, int o) { (void) s; (void) v; (void) x; (void) o; return ESPANK_SUCCESS; }
spank_err_t spank_unsetenv(spank_t s, const char *v) { (void) s; (void) v; return ESPANK_SUCCESS; }
spank_err_t spank_job_control_setenv(spank_t s, const char *n, const char *v, int o)
{
    (void) s; (void) o;
    printf("JOBCONTROL %s=%s\n", n, v);
    fflush(stdout);
    return ESPANK_SUCCESS;
}

int main(int argc, char **argv)
{
    int i, rc;
    void *h;
    int (*start)(const char *, const struct sg_outer_api *);
    int (*hook)(int, spank_t);
    int (*option)(int, int);
    if (argc < 6)
        return 2;
    h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        printf("DLOPEN %s\n", dlerror());
        return 2;
    }
    start = dlsym(h, "sg_inner_start");
    hook = dlsym(h, "sg_inner_hook");
    option = dlsym(h, "sg_inner_option");
    for (i = 0; i < 4; i++)
        vals[i] = strcmp(argv[2 + i], "-") ? argv[2 + i] : NULL;
    if (start("test", &api) != 0) {
        printf("START -1\n");
        return 3;
    }
    rc = 0;
    for (i = 0; i < 4; i++)
        if (vals[i]) {
            int orc = option(i, 0);
            printf("OPTION %d %d\n", i, orc);
            rc |= orc;
        }
    fflush(stdout);
    if (rc != 0)                         /* like srun: stop at a bad option */
        return 1;
    rc = hook(1, NULL);                  /* init_post_opt */
    printf("HOOK %d\n", rc);
    fflush(stdout);
    if (argc > 6) {
        int (*ensure)(void) = dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
        int (*run)(const char *) = dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
        if (!ensure || !run)
            return 4;
        ensure();
        run(argv[6]);
    }
    return 0;
}
