# PdlInstall.cmake -- what `cmake --install` (and `make install PREFIX=... DESTDIR=...`) puts in place:
#   lib/libpdlink.so.X.Y.Z (+ .so.N, .so), lib/libpdlink.a, include/pdlink/*.h (with version.h),
#   lib/pkgconfig/pdlink.pc, lib/cmake/pdlink/ (find_package(pdlink)), and with the programs
#   bin/pdlink, bin/pdlink-node, bin/pdlink-router and their man pages (share/man/man1, from --help).
include(CMakePackageConfigHelpers)

set(pdl_install_targets pdlink_static)
if(PDL_BUILD_SHARED)
  list(APPEND pdl_install_targets pdlink_shared)
endif()
install(TARGETS ${pdl_install_targets} EXPORT pdlinkTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
set(pdl_install_headers ${PROJECT_BINARY_DIR}/include/pdlink/version.h)
foreach(layer IN LISTS PDL_LAYERS)
  foreach(h IN LISTS PDL_PUBLIC_${layer})
    list(APPEND pdl_install_headers ${PROJECT_SOURCE_DIR}/include/pdlink/${h})
  endforeach()
endforeach()
install(FILES ${pdl_install_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pdlink COMPONENT dev)

# pdlink.pc finds its prefix from where it is (${pcfiledir}), so an installed tree can be moved or used
# from a DESTDIR staging directory.
file(RELATIVE_PATH PDL_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" PDL_PC_TO_PREFIX "${PDL_PC_TO_PREFIX}")
set(PDL_PC_REQUIRES_PRIVATE "jansson libzmq libsodium msgpack libxxhash")
if(PDL_HAVE_UCX)
  string(APPEND PDL_PC_REQUIRES_PRIVATE " ucx")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/pdlink.pc.in ${PROJECT_BINARY_DIR}/pdlink.pc @ONLY)
# The same list for python/pdlink/_build.py, which links libpdlink.a of this build tree into the extension.
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/pdlink-deps.txt CONTENT "${PDL_PC_REQUIRES_PRIVATE}\n")
install(FILES ${PROJECT_BINARY_DIR}/pdlink.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

set(pdl_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/pdlink)
install(EXPORT pdlinkTargets NAMESPACE pdlink:: DESTINATION ${pdl_cmake_dir} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pdlinkConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/pdlinkConfig.cmake INSTALL_DESTINATION ${pdl_cmake_dir})
# Before 1.0 a minor release may change the API: only the same MAJOR.MINOR satisfies a request.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pdlinkConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pdlinkConfig.cmake ${PROJECT_BINARY_DIR}/pdlinkConfigVersion.cmake
        DESTINATION ${pdl_cmake_dir} COMPONENT dev)

if(PDL_BUILD_PROGRAMS)
  install(TARGETS pdlink pdlink-node pdlink-router RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT bin)
  # Man pages are each program's --help, formatted by help2man (Debian's help2man): one text to keep
  # current. They are built with the programs, so a cross build (programs that cannot run here) has none.
  find_program(HELP2MAN help2man)
  if(PDL_MAN_PAGES AND HELP2MAN AND NOT CMAKE_CROSSCOMPILING)
    set(man_dir ${PROJECT_BINARY_DIR}/man)
    set(pdl_man_pages "")
    foreach(prog pdlink pdlink-node pdlink-router)
      if(prog STREQUAL "pdlink")
        set(what "KV-cache transfer for prefill/decode LLM serving: run, plan, bench")
      elseif(prog STREQUAL "pdlink-node")
        set(what "an emulated vllm serve instance with a MoRIIO KV connector")
      else()
        set(what "a prefill/decode router speaking vllm-router's MoRIIO mode")
      endif()
      add_custom_command(OUTPUT ${man_dir}/${prog}.1
        COMMAND ${CMAKE_COMMAND} -DPROG=$<TARGET_FILE:${prog}> -DNAME=${prog} -DWHAT=${what}
                -DHELP2MAN=${HELP2MAN} -DVERSION=${PROJECT_VERSION} -DOUT=${man_dir}/${prog}.1
                -P ${PROJECT_SOURCE_DIR}/cmake/PdlManPage.cmake
        DEPENDS ${prog} ${PROJECT_SOURCE_DIR}/cmake/PdlManPage.cmake VERBATIM)
      list(APPEND pdl_man_pages ${man_dir}/${prog}.1)
    endforeach()
    add_custom_target(pdl_man_pages ALL DEPENDS ${pdl_man_pages})
    install(FILES ${pdl_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT bin)
  elseif(PDL_MAN_PAGES)
    message(STATUS "pdlink: no man pages (help2man not found: apt-get install help2man)")
  endif()
endif()
