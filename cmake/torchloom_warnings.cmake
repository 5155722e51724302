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
      # A finding ends the test run instead of a line in the log that nobody reads. The vptr
      # check needs the typeinfo of every polymorphic class it meets, and LibTorch does not
      # export all of it (c10::DynamicType): with it on, the tests do not even link.
      target_compile_options(${target} PRIVATE -fno-sanitize-recover=undefined
                                               -fno-sanitize=vptr)
      target_link_options(${target} PRIVATE -fno-sanitize=vptr)
    endif()
    if(TORCHLOOM_SANITIZE MATCHES "address" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      # GCC's flow analysis gives false maybe-uninitialized warnings under ASan (inside
      # libstdc++'s <regex>, which Catch2 includes); GCC's manual warns of this.
      target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
    endif()
  endif()
endfunction()
