# PdlDeps.cmake -- the libraries pdlink builds with, found through pkg-config. The library needs libzmq,
# libsodium, msgpack-c and jansson; UCX only for the ucx backend (PDL_WITH_UCX); the programs and the
# tests need more, and only when they are built, so that libpdlink alone builds on a machine without
# them. A missing package stops configuring with the Debian package that provides it.

function(pdl_require prefix module debian why)
  pkg_check_modules(${prefix} QUIET IMPORTED_TARGET ${module})
  if(NOT ${prefix}_FOUND)
    message(FATAL_ERROR "pdlink: ${module} not found (pkg-config ${module}); it is needed for ${why}. "
                        "On Debian: apt-get install ${debian}, or run scripts/install-deps.")
  endif()
endfunction()

pdl_require(ZMQ libzmq libzmq3-dev "the connector")
# libsodium: authenticated mode's key derivation and MACs (common/auth.c); libzmq's CURVE links it too.
pdl_require(SODIUM libsodium libsodium-dev "authenticated mode")
pdl_require(MSGPACK msgpack libmsgpack-dev "the wire codecs")
pdl_require(JANSSON jansson libjansson-dev "configuration and kv_transfer_params")
# xxHash: the KV integrity digests (XXH3, layout/digest.c; docs/integrity.md).
pdl_require(XXHASH libxxhash libxxhash-dev "the KV integrity digests")

if(NOT PDL_WITH_UCX MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "PDL_WITH_UCX must be AUTO, ON or OFF, not '${PDL_WITH_UCX}'")
endif()
set(PDL_HAVE_UCX OFF)
set(PDL_UCX_TARGET "")
if(PDL_WITH_UCX STREQUAL "ON")
  pdl_require(UCX ucx libucx-dev "the ucx backend (PDL_WITH_UCX=ON; OFF builds without it)")
elseif(PDL_WITH_UCX STREQUAL "AUTO")
  pkg_check_modules(UCX QUIET IMPORTED_TARGET ucx)
endif()
if(UCX_FOUND AND NOT PDL_WITH_UCX STREQUAL "OFF")
  set(PDL_HAVE_UCX ON)
  set(PDL_UCX_TARGET PkgConfig::UCX)
  message(STATUS "pdlink: ucx backend: UCX ${UCX_VERSION}")
else()
  if(PDL_WITH_UCX STREQUAL "OFF")
    set(why "PDL_WITH_UCX=OFF")
  else()
    set(why "UCX's pkg-config module 'ucx' not found: apt-get install libucx-dev")
  endif()
  message(STATUS "pdlink: ucx backend: not built (${why}); backend \"ucx\" will be refused and \"rdma\" "
                 "will mean tcp")
endif()

if(PDL_BUILD_TESTS AND NOT PDL_BUILD_PROGRAMS)
  message(FATAL_ERROR "PDL_BUILD_TESTS needs PDL_BUILD_PROGRAMS (the tests run and link the programs)")
endif()
if(PDL_BUILD_PROGRAMS)
  pdl_require(MHD libmicrohttpd libmicrohttpd-dev "the programs' HTTP servers (PDL_BUILD_PROGRAMS=OFF builds the library alone)")
  pdl_require(CURL libcurl libcurl4-openssl-dev "the programs (PDL_BUILD_PROGRAMS=OFF builds the library alone)")
endif()
if(PDL_BUILD_TESTS)
  pdl_require(CMOCKA cmocka libcmocka-dev "the tests (PDL_BUILD_TESTS=OFF builds without them)")
endif()
