# Flags for torchloom's own translation units (tests, benchmarks, examples). Torch and Boost
# come in as system headers, so -Werror applies to our code only.
function(torchloom_project_flags target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow
                           $<$<COMPILE_LANGUAGE:CXX>:-Wnon-virtual-dtor -Wold-style-cast>)
  if(TORCHLOOM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(TORCHLOOM_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${TORCHLOOM_SANITIZE}
                                             -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${TORCHLOOM_SANITIZE})
    if(TORCHLOOM_SANITIZE MATCHES "undefined")
      # A finding ends the test run instead of a line in the log that nobody reads.
      target_compile_options(${target} PRIVATE -fno-sanitize-recover=undefined)
    endif()
    if(TORCHLOOM_SANITIZE MATCHES "address" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      # GCC's flow analysis gives false maybe-uninitialized warnings under ASan (inside
      # libstdc++'s <regex>, which Catch2 includes); GCC's manual warns of this.
      target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
    endif()
  endif()
endfunction()
