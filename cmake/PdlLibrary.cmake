# PdlLibrary.cmake -- libpdlink as other programs link it: libpdlink.so (SONAME libpdlink.so.PDL_SOVERSION)
# and libpdlink.a, both made of the layers' objects (pdl_<layer>_obj), so nothing is compiled twice and
# the layer libraries the build uses to enforce the architecture stay as they are.
#
# The shared library exports exactly the functions declared in include/pdlink/ (and the generated
# pdlink/version.h): a linker version script made from those headers at configure time hides the
# internal pdl__* functions and the few internal pdl_* helpers, so a program cannot come to depend on
# them and the dynamic symbol table is the API.

set(pdl_dep_targets "")
foreach(layer IN LISTS PDL_LAYERS)
  list(APPEND pdl_dep_targets ${PDL_DEPS_${layer}})
endforeach()
list(REMOVE_DUPLICATES pdl_dep_targets)
# The installed headers name no type of these libraries, so all of them are the library's own (private)
# dependencies; a static link still needs them, hence the INTERFACE link of pdlink_static.

set(pdl_api_headers ${PROJECT_BINARY_DIR}/include/pdlink/version.h)
foreach(layer IN LISTS PDL_LAYERS)
  foreach(h IN LISTS PDL_PUBLIC_${layer})
    list(APPEND pdl_api_headers ${PROJECT_SOURCE_DIR}/include/pdlink/${h})
  endforeach()
endforeach()
set(pdl_api_functions "")
foreach(h IN LISTS pdl_api_headers)
  file(READ ${h} text)
  # A declaration's name is followed by its parameter list; names of function-pointer types by ")".
  string(REGEX MATCHALL "[^A-Za-z0-9_]pdl_[a-z][a-z0-9_]*[ \t]*\\(" names "${text}")
  foreach(n IN LISTS names)
    string(REGEX REPLACE "^.(pdl_[a-z0-9_]*).*$" "\\1" n "${n}")
    list(APPEND pdl_api_functions ${n})
  endforeach()
endforeach()
list(REMOVE_DUPLICATES pdl_api_functions)
list(SORT pdl_api_functions)
list(JOIN pdl_api_functions ";\n    " pdl_api_list)
set(PDL_VERSION_SCRIPT ${PROJECT_BINARY_DIR}/libpdlink.map)
file(CONFIGURE OUTPUT ${PDL_VERSION_SCRIPT} CONTENT "PDLINK_${PDL_SOVERSION} {\n  global:\n    ${pdl_api_list};\n  local:\n    *;\n};\n")

set(pdl_public_includes $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                        $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
                        $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

add_library(pdlink_static STATIC ${pdl_objects})
set_target_properties(pdlink_static PROPERTIES OUTPUT_NAME pdlink EXPORT_NAME pdlink_static)
target_include_directories(pdlink_static INTERFACE ${pdl_public_includes})
target_link_libraries(pdlink_static INTERFACE ${pdl_dep_targets})
add_library(pdlink::pdlink_static ALIAS pdlink_static)

if(PDL_BUILD_SHARED)
  # The target is pdlink_shared because `pdlink` is the program; installed, it is pdlink::pdlink.
  add_library(pdlink_shared SHARED ${pdl_objects})
  set_target_properties(pdlink_shared PROPERTIES OUTPUT_NAME pdlink EXPORT_NAME pdlink VERSION ${PROJECT_VERSION}
                        SOVERSION ${PDL_SOVERSION} LINK_DEPENDS ${PDL_VERSION_SCRIPT})
  target_include_directories(pdlink_shared INTERFACE ${pdl_public_includes})
  target_link_libraries(pdlink_shared PRIVATE ${pdl_dep_targets})
  target_link_options(pdlink_shared PRIVATE -Wl,--version-script=${PDL_VERSION_SCRIPT})
  # Every symbol it needs comes from its dependencies (not from the program loading it) -- except under
  # the sanitizers, whose runtimes only the executable links.
  if(PDL_SANITIZE STREQUAL "" AND NOT PDL_FUZZ)
    target_link_options(pdlink_shared PRIVATE -Wl,--no-undefined)
  endif()
  add_library(pdlink::pdlink ALIAS pdlink_shared)
endif()
