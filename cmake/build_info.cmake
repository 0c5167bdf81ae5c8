# Writes OUT (a Python module, flashspan/_build_info.py in the wheel) with the git revision of
# SRC at build time: the benchmark report records it (an installed package has no checkout to ask).
# Run at every build (add_custom_target in CMakeLists.txt): cmake -DSRC=... -DOUT=... -P build_info.cmake
execute_process(COMMAND git rev-parse HEAD WORKING_DIRECTORY "${SRC}" OUTPUT_VARIABLE rev
                OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0 OR rev STREQUAL "")
  set(rev "unknown")
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY "${SRC}"
                  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT dirty STREQUAL "")
    string(APPEND rev "-dirty")
  endif()
endif()
set(text "\"\"\"Written at build time by cmake/build_info.cmake.\"\"\"\n\nGIT_REVISION = \"${rev}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
