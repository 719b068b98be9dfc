"""cffi builder of ``pdlink._pdlink``: libpdlink's C API, compiled in API mode.

API mode (``set_source``) lets the C compiler check every declaration below against the real headers
in ``include/pdlink/`` and compute the struct layouts (``...;``), so the Python side never hard-codes an
offset that could drift from the C library. The extension links libpdlink statically (``libpdlink.a``,
compiled with ``-fPIC``) and the system libraries it needs (libzmq, libsodium, msgpack-c, jansson, and
UCX when libpdlink was built with it), so the wheel carries no libpdlink of its own to find at run time.

The extension's own C (the held-transfer event queue and the calls taking kv_transfer_params as JSON
text) is ``shim.c``, declared in ``shim.h``, whose declarations are given to cffi from the header
itself (:func:`shim_cdef`).

Where libpdlink.a comes from:

* ``PDLINK_BUILD_DIR=<dir>``: an existing CMake build of the repository (``make build`` makes ``build/``);
  the repository's tests use this to test the library they just built.
* otherwise ``setup.py`` configures and builds the repository's CMake project itself (the library only:
  no programs, no tests, no cmocka/libmicrohttpd/curl needed) in ``python/build/libpdlink``, Release, with
  ``PDLINK_WITH_UCX`` (AUTO, ON or OFF; default AUTO) and ``PDLINK_CMAKE_ARGS`` passed on, and ccache as
  the compiler launcher when it is installed. ``pip install ./python`` and ``pip wheel ./python`` need
  only CMake >= 3.25, a C compiler, pkg-config and the libraries' development files.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
REPO = Path(os.environ.get("PDLINK_SOURCE_DIR", HERE.parent.parent)).resolve()
OWN_BUILD = HERE.parent / "build" / "libpdlink"


def build_dir() -> Path:
    """The CMake build directory whose libpdlink.a the extension links."""
    given = os.environ.get("PDLINK_BUILD_DIR")
    return Path(given).resolve() if given else OWN_BUILD


def build_libpdlink() -> Path:
    """Make sure libpdlink.a exists: check a given build tree, or configure and build our own."""
    bdir = build_dir()
    if os.environ.get("PDLINK_BUILD_DIR"):
        if not (bdir / "libpdlink.a").exists():
            raise RuntimeError(f"pdlink: PDLINK_BUILD_DIR={bdir} has no libpdlink.a; run `make build` in {REPO} "
                               f"(or unset PDLINK_BUILD_DIR to let this build compile libpdlink itself)")
        return bdir
    if not (REPO / "CMakeLists.txt").exists():
        raise RuntimeError(f"pdlink: the pdlink repository is not at {REPO}: python/ builds libpdlink from its "
                           f"parent folder (or set PDLINK_SOURCE_DIR)")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("pdlink: building libpdlink needs CMake >= 3.25 (Debian: apt-get install cmake)")
    args = [cmake, "-S", str(REPO), "-B", str(bdir), "-DCMAKE_BUILD_TYPE=Release",
            "-DPDL_BUILD_PROGRAMS=OFF", "-DPDL_BUILD_TESTS=OFF", "-DPDL_BUILD_SHARED=OFF",
            f"-DPDL_WITH_UCX={os.environ.get('PDLINK_WITH_UCX', 'AUTO')}"]
    if not (bdir / "CMakeCache.txt").exists():
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        if shutil.which("ccache"):
            args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
    args += shlex.split(os.environ.get("PDLINK_CMAKE_ARGS", ""))
    subprocess.run(args, check=True)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    subprocess.run([cmake, "--build", str(bdir), "--target", "pdlink_static", "-j", jobs], check=True)
    return bdir


def link_args(bdir: Path) -> dict:
    """extra_objects, libraries and library_dirs for linking libpdlink.a from bdir statically."""
    modules = (bdir / "pdlink-deps.txt").read_text().split()
    out = subprocess.run(["pkg-config", "--libs", *modules], check=True, capture_output=True, text=True).stdout
    libs = shlex.split(out)
    return {
        "extra_objects": [str(bdir / "libpdlink.a")],
        "libraries": [a[2:] for a in libs if a.startswith("-l")] + ["pthread", "m"],
        "library_dirs": [a[2:] for a in libs if a.startswith("-L")],
    }


# libpdlink's API as cffi declares it (``...;``: the compiler fills in the layout); the shim's own
# declarations follow from shim.h (shim_cdef).
CDEF = r"""
typedef enum pdl_status { PDL_OK = 0, PDL_INPROGRESS = 1, PDL_ERR_INVALID = -1, PDL_ERR_NOT_FOUND = -2,
    PDL_ERR_TRANSPORT = -3, PDL_ERR_BAD_STATE = -4, PDL_ERR_TIMEOUT = -5, PDL_ERR_PEER_GONE = -6,
    PDL_ERR_NOMEM = -7, PDL_ERR_PARSE = -8, PDL_ERR_UNSUPPORTED = -9, PDL_ERR_MISMATCH = -10,
    PDL_ERR_SYSTEM = -11 } pdl_status_t;
typedef struct pdl_error { pdl_status_t status; char msg[...]; ...; } pdl_error_t;
const char *pdl_status_name(pdl_status_t st);
const char *pdl_status_string(pdl_status_t st);
int pdl_log_level_parse(const char *s);

typedef enum { PDL_ROLE_PRODUCER = 1, PDL_ROLE_CONSUMER = 2 } pdl_role_t;
typedef enum { PDL_KV_HND = 0, PDL_KV_NHD = 1 } pdl_kv_order_t;
typedef int... pdl_backend_kind_t;
const char *pdl_backend_name(pdl_backend_kind_t kind);
int pdl_backend_parse(const char *s);
typedef enum { PDL_MEM_TYPE_HOST = 0, PDL_MEM_TYPE_CUDA = 1, PDL_MEM_TYPE_ROCM = 2 } pdl_mem_type_t;

typedef struct pdl_connector_config {
    pdl_role_t role; char host_ip[...]; char proxy_ip[...]; int proxy_ping_port; int http_port;
    bool read_mode; pdl_backend_kind_t backend; bool backend_mapped_from_rdma; int handshake_port; int notify_port;
    ...;
} pdl_connector_config_t;
pdl_status_t pdl_connector_config_parse(const char *json_text, pdl_connector_config_t *cfg, pdl_error_t *err);
pdl_status_t pdl_connector_config_check(const char *json_text, pdl_connector_config_t *cfg, pdl_error_t *err);

typedef struct pdl_model_geometry {
    int num_layers; int total_kv_heads; int head_dim; int elem_size; int block_size; bool is_mla;
    pdl_kv_order_t order; bool kv_separate; bool kv_fused; ...;
} pdl_model_geometry_t;
typedef struct pdl_instance_config {
    pdl_connector_config_t conn; pdl_model_geometry_t model; int tp_size; int dp_rank; int dp_size;
    uint32_t num_blocks; const char *attn_backend_name; bool allow_write_mode;
    void *const *kv_regions; const size_t *kv_region_lens; pdl_mem_type_t kv_mem_type; int local_rank;
    bool external_blocks; void *const *const *kv_layer_regions; const size_t *const *kv_layer_region_lens; ...;
} pdl_instance_config_t;
void pdl_instance_config_defaults(pdl_instance_config_t *cfg);
typedef struct pdl_kv_geometry {
    uint64_t num_blocks; uint32_t block_size; uint32_t num_heads; uint32_t head_dim; uint32_t elem_size;
    bool kv_separate; bool is_mla; pdl_kv_order_t order; bool kv_fused; ...;
} pdl_kv_geometry_t;
uint64_t pdl_layout_region_len(const pdl_kv_geometry_t *g);
uint64_t pdl_layout_block_len(const pdl_kv_geometry_t *g);

typedef struct pdl_instance pdl_instance_t;
typedef struct pdl_pull pdl_pull_t;
typedef struct pdl_recv pdl_recv_t;
pdl_status_t pdl_instance_kv_region_len(const pdl_instance_config_t *cfg, int tp_rank, uint64_t *len_out,
                                        pdl_error_t *err);
pdl_status_t pdl_instance_create(const pdl_instance_config_t *cfg, pdl_instance_t **inst_out, pdl_error_t *err);
void pdl_instance_destroy(pdl_instance_t *inst);
const char *pdl_instance_engine_id(const pdl_instance_t *inst);
const char *pdl_instance_zmq_address(const pdl_instance_t *inst);
int pdl_instance_tp_size(const pdl_instance_t *inst);
int pdl_instance_local_rank(const pdl_instance_t *inst);
int pdl_instance_handshake_port(const pdl_instance_t *inst, int tp_rank);
int pdl_instance_notify_port(const pdl_instance_t *inst, int tp_rank);
const pdl_kv_geometry_t *pdl_instance_geometry(const pdl_instance_t *inst, int tp_rank);
uint8_t *pdl_instance_kv_layer(pdl_instance_t *inst, int tp_rank, int layer);
pdl_status_t pdl_instance_alloc_blocks(pdl_instance_t *inst, size_t n, uint32_t *ids_out, pdl_error_t *err);
void pdl_instance_free_blocks(pdl_instance_t *inst, const uint32_t *ids, size_t n);
size_t pdl_instance_free_block_count(pdl_instance_t *inst);
pdl_status_t pdl_instance_hold_for(pdl_instance_t *inst, const char *transfer_id, const char *request_id,
                                   const uint32_t *ids, size_t n, pdl_error_t *err);
pdl_status_t pdl_instance_zero_tail(pdl_instance_t *inst, const uint32_t *ids, size_t n, uint64_t num_tokens,
                                    pdl_error_t *err);
pdl_status_t pdl_instance_drop(pdl_instance_t *inst, const char *transfer_id, pdl_error_t *err);
size_t pdl_instance_held_transfers(pdl_instance_t *inst);
size_t pdl_instance_held_blocks(pdl_instance_t *inst);
pdl_status_t pdl_pull_wait(pdl_pull_t *pull, int timeout_ms, pdl_error_t *err);
uint64_t pdl_pull_bytes(const pdl_pull_t *pull);
uint64_t pdl_pull_descriptors(const pdl_pull_t *pull);
void pdl_pull_free(pdl_pull_t *pull);
pdl_status_t pdl_recv_wait(pdl_recv_t *rv, int timeout_ms, pdl_error_t *err);
int pdl_recv_write_done(pdl_recv_t *rv, int tp_rank);
void pdl_recv_free(pdl_recv_t *rv);

typedef enum { PDL_COUNTER_COUNT = 0, PDL_COUNTER_NS = 1 } pdl_counter_kind_t;
typedef struct pdl_rank_counters { ...; } pdl_rank_counters_t;
typedef struct pdl_counter_info { const char *name; const char *help; pdl_counter_kind_t kind; size_t offset; }
    pdl_counter_info_t;
const pdl_counter_info_t *pdl_rank_counters_table(size_t *n);
pdl_status_t pdl_instance_counters(pdl_instance_t *inst, int tp_rank, pdl_rank_counters_t *out, pdl_error_t *err);

typedef struct pdl_plan_piece { int producer_rank; int first_head; int num_heads; int src_head; int dst_head; }
    pdl_plan_piece_t;
typedef struct pdl_read_plan {
    int group_first; int group_count; int local_first_head; int local_num_heads; int num_pieces;
    pdl_plan_piece_t pieces[...]; ...;
} pdl_read_plan_t;
typedef struct pdl_write_target { int consumer_rank; pdl_plan_piece_t piece; } pdl_write_target_t;
typedef struct pdl_write_plan {
    int notify_first; int notify_count; int num_targets; pdl_write_target_t targets[...]; ...;
} pdl_write_plan_t;
pdl_status_t pdl_topo_expected_acks(int prefill_tp, int decode_tp, int *out, pdl_error_t *err);
pdl_status_t pdl_topo_expected_write_done(int prefill_tp, int decode_tp, int *out, pdl_error_t *err);
pdl_status_t pdl_topo_heads(int tp, int total_heads, bool is_mla, int rank, int *first_out, int *count_out,
                            pdl_error_t *err);
pdl_status_t pdl_topo_read_plan(int prefill_tp, int decode_tp, int total_heads, bool is_mla, int consumer_rank,
                                pdl_read_plan_t *out, pdl_error_t *err);
pdl_status_t pdl_topo_write_plan(int prefill_tp, int decode_tp, int total_heads, bool is_mla, int producer_rank,
                                 pdl_write_plan_t *out, pdl_error_t *err);

typedef enum { PDL_EVENT_RANK_REPORTED = 1, PDL_EVENT_RANK_EXPIRED = 2, PDL_EVENT_FREED = 3 } pdl_instance_event_t;
typedef void (*pdl_instance_event_fn)(void *arg, pdl_instance_event_t ev, const char *transfer_id, int tp_rank);
void pdl_instance_set_event_fn(pdl_instance_t *inst, pdl_instance_event_fn fn, void *arg);
pdl_status_t pdl_instance_push_layers(pdl_instance_t *inst, const char *transfer_id, int layers, pdl_error_t *err);
void free(void *p);
"""

PREAMBLE = """\
#include "pdlink/connector.h"
#include "pdlink/log.h"
#include "pdlink/topo.h"
#include "shim.h"
"""
SHIM_H = HERE / "shim.h"
SHIM_C = HERE / "shim.c"


def shim_cdef() -> str:
    """shim.h's declarations for cffi, which takes C declarations but no preprocessor lines."""
    return "\n".join(l for l in SHIM_H.read_text().splitlines() if not l.lstrip().startswith("#"))


def _source_path(path: Path) -> str:
    # setuptools wants the extension's sources relative to setup.py's folder (python/), where pip runs it.
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _builder(**link: object) -> FFI:
    ffi = FFI()
    ffi.cdef(CDEF + shim_cdef())
    # The module's own source only includes the headers CDEF declares from; the shim is shim.c, compiled
    # beside it. setup.py's build_ext adds the link arguments once libpdlink.a is built (link_args).
    ffi.set_source(
        "pdlink._pdlink", PREAMBLE,
        sources=[_source_path(SHIM_C)],
        depends=[_source_path(SHIM_H)],
        include_dirs=[str(HERE), str(REPO / "include")],
        extra_compile_args=["-std=gnu11", "-Wall", "-Wno-unused-function", "-Werror=implicit-function-declaration"],
        **link,
    )
    return ffi


ffibuilder = _builder()

if __name__ == "__main__":
    _builder(**link_args(build_libpdlink())).compile(verbose=True)
