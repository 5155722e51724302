# Rules the compiler cannot check, over the project's C++ sources (cmake -D SOURCE_DIR=... -P).
#
# No call to std::filesystem::remove_all: pip torch's libtorch.so exports its own copy of it
# (from a statically linked libstdc++), the dynamic linker binds a program's calls to that
# copy, and it crashes (torch 2.11). Only the GPU machine, with pip torch, shows it: the
# program dies at the call, often at exit. Remove known files one by one, or walk the tree
# with POSIX nftw (tests/support/temp_dir.hpp).
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "usage: cmake -D SOURCE_DIR=<repository> -P source_rules.cmake")
endif()
set(found "")
foreach(dir include bench tests backends examples tools)
  file(GLOB_RECURSE files "${SOURCE_DIR}/${dir}/*.hpp" "${SOURCE_DIR}/${dir}/*.cpp"
       "${SOURCE_DIR}/${dir}/*.h" "${SOURCE_DIR}/${dir}/*.cc")
  foreach(f IN LISTS files)
    file(STRINGS "${f}" lines REGEX "remove_all[ \t]*\\(")
    foreach(line IN LISTS lines)
      string(STRIP "${line}" line)
      file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
      string(APPEND found "  ${rel}: ${line}\n")
    endforeach()
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "std::filesystem::remove_all is called (pip torch's copy of it crashes; "
                      "see tests/rules/source_rules.cmake):\n${found}")
endif()
message(STATUS "source rules: ok")
