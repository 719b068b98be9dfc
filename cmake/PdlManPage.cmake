# PdlManPage.cmake -- one man page from a program's --help (cmake -P; called by PdlInstall.cmake).
# -DPROG=<executable> -DNAME=<name> -DWHAT=<one line> -DHELP2MAN=<help2man> -DVERSION=<x.y.z> -DOUT=<file>
# For `pdlink`, each command's --help (run, plan, bench) becomes a COMMANDS section of the same page.
get_filename_component(dir ${OUT} DIRECTORY)
file(MAKE_DIRECTORY ${dir})
set(include_args "")
if(NAME STREQUAL "pdlink")
  set(include_file ${OUT}.include)
  set(include_args --include=${include_file})
  file(WRITE ${include_file} "[COMMANDS]\n")
  foreach(cmd run plan bench)
    execute_process(COMMAND ${PROG} ${cmd} --help OUTPUT_VARIABLE help ERROR_VARIABLE help RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${NAME} ${cmd} --help exited ${rc}")
    endif()
    # roff: a leading dot or quote starts a request, a backslash an escape.
    string(REPLACE "\\" "\\e" help "${help}")
    string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" help "${help}")
    file(APPEND ${include_file} ".SS \"${NAME} ${cmd}\"\n.nf\n${help}.fi\n")
  endforeach()
endif()
execute_process(COMMAND ${HELP2MAN} --no-info --no-discard-stderr --version-string=${VERSION}
                        --name=${WHAT} ${include_args} --output=${OUT} ${PROG}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "help2man ${PROG} exited ${rc}")
endif()
if(include_file)
  file(REMOVE ${include_file})
endif()
