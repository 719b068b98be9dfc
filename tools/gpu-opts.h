/*
 * gpu-opts.h -- the options tools/gpu-check.c and tools/cuda-bench.c share: the KV shape they move and
 * how often, as rows of one options table each (src/app/optab.h), so both parse, check and print --help
 * the same way. Each tool adds its own rows (--driver, --json); gpu_opts_parse stores the shape in its globals.
 */
#ifndef PDL_TOOLS_GPU_OPTS_H
#define PDL_TOOLS_GPU_OPTS_H

#include <stddef.h>
#include <stdio.h>

#include "app/optab.h"

typedef struct gpu_opts {
    int layers, blocks, iters;
    int driver;       /* cuda-bench: an index into its driver names */
    const char *json; /* gpu-check: where the decode writes its JSON rows, or NULL */
} gpu_opts_t;

#define GPU_OPT(f) offsetof(gpu_opts_t, f)

/* The shape rows; ITERS_DEF is the tool's default pass count, as text. */
#define GPU_OPT_SHAPE_ROWS(ITERS_DEF)                                                                          \
    {.name = "layers", .kind = PDL_OPT_INT, .metavar = "N", .def = "4", .off = GPU_OPT(layers), .lo = 1,       \
     .hi = 16, .help = "layers, each its own registered region"},                                             \
        {.name = "blocks", .kind = PDL_OPT_INT, .metavar = "N", .def = "1024", .off = GPU_OPT(blocks), .lo = 8, \
         .hi = 1 << 20, .help = "blocks per layer (16 tokens x 32 heads x 128 fp16 each, K and V)"},          \
        {.name = "iters", .kind = PDL_OPT_INT, .metavar = "N", .def = ITERS_DEF, .off = GPU_OPT(iters), .lo = 1, \
         .hi = 1 << 20, .help = "passes per row (the best is reported)"}

/* Parse argv into *o through table t (its prog names the tool in errors) and store the shape in the
 * tool's globals. -1: go on; otherwise the exit status (0 after --help, 2 on a usage error, said on
 * stderr). */
static inline int gpu_opts_parse(const pdl_optab_t *t, gpu_opts_t *o, int argc, char **argv, int *layers,
                                 int *blocks, int *iters)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_optab_result_t r = pdl_optab_parse(t, o, argc, argv, NULL, &err);
    if (r != PDL_OPTAB_GO)
        return r == PDL_OPTAB_DONE ? 0 : (fprintf(stderr, "%s: %s\n", t->prog, err.msg), 2);
    *layers = o->layers;
    *blocks = o->blocks;
    *iters = o->iters;
    return -1;
}

#endif /* PDL_TOOLS_GPU_OPTS_H */
