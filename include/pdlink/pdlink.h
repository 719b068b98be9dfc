/*
 * pdlink.h -- libpdlink's whole API in one include: `#include <pdlink/pdlink.h>`.
 *
 * pdlink moves the KV cache of a prompt from the prefill instance that computed it to the decode
 * instance that continues it (vLLM's MoRIIO connector protocol). The headers below are the manual, one
 * per layer, lowest first; each can also be included on its own:
 *
 *   status.h     pdl_status_t, the error record every call can fill, status names and messages
 *   log.h        the library's log level and ident (an embedder sets nothing else)
 *   types.h      descriptors and byte strings shared by the layers
 *   auth.h       the cluster secret of authenticated mode
 *   topo.h       rank mapping, groups, ACK counts, head ownership, read and write plans
 *   layout.h     KV geometry of a layer as byte ranges; models.h: model presets
 *   wire.h       the control messages and handshake payloads, encoded and decoded
 *   params.h     vLLM's kv_transfer_params, to and from JSON text
 *   engine.h     the transfer engine: registered memory, sessions, batched one-sided READ and WRITE
 *   connector.h  the per-instance connector runtime: hold, pull, push, releases, counters;
 *                pull_hook.h: a pull that runs caller work on each rank as its bytes arrive
 *   version.h    PDL_VERSION_* of these headers (generated), pdl_version_string() of the library
 *
 * No header names a type of another library: JSON crosses the API as text, sockets stay inside.
 *
 * Config structs that can grow. pdl_engine_config_t, pdl_connector_config_t and pdl_instance_config_t
 * are filled by the caller and gain fields over releases. A program starts from the struct's defaults
 * function (pdl_engine_config_defaults, pdl_connector_config_defaults, pdl_instance_config_defaults)
 * and then sets the fields it needs by name. A release adds fields only at the end of a struct and
 * makes its defaults function give each new field the value that keeps the earlier behaviour, so such a
 * program compiles and behaves the same against later headers. The size of these structs is part of
 * the binary interface: a release that changes one bumps PDL_ABI_VERSION, the number in libpdlink.so's
 * SONAME, so a program built against the old layout keeps loading the library it was built for.
 */
#ifndef PDLINK_PDLINK_H
#define PDLINK_PDLINK_H

#include "pdlink/status.h"
#include "pdlink/log.h"
#include "pdlink/types.h"
#include "pdlink/auth.h"
#include "pdlink/topo.h"
#include "pdlink/layout.h"
#include "pdlink/models.h"
#include "pdlink/wire.h"
#include "pdlink/params.h"
#include "pdlink/engine.h"
#include "pdlink/connector.h"
#include "pdlink/pull_hook.h"
#include "pdlink/version.h"

#endif /* PDLINK_PDLINK_H */
