# SPDX-License-Identifier: BSD-3-Clause
# Finds what torchloom's headers need: LibTorch and Boost >= 1.77 (Boost.Describe), and
# reports whether the CUDA part can be built: a CUDA toolkit *and* a CUDA build of torch.
# Sets TORCHLOOM_DEPENDENCIES_FOUND and TORCHLOOM_CUDA_FOUND.
include_guard(GLOBAL)

# Imported targets are visible only below the directory that found them. When torchloom is
# added with add_subdirectory and finds Torch itself, make Torch's targets (and what they
# link) global, so the parent project can link torchloom::torchloom.
function(_torchloom_make_global target)
  if(NOT TARGET ${target})
    return()
  endif()
  get_target_property(imported ${target} IMPORTED)
  get_target_property(global ${target} IMPORTED_GLOBAL)
  get_target_property(dir ${target} SOURCE_DIR)
  if(NOT imported OR global OR NOT dir STREQUAL CMAKE_CURRENT_SOURCE_DIR)
    return()
  endif()
  set_target_properties(${target} PROPERTIES IMPORTED_GLOBAL TRUE)
  set(deps)
  foreach(property INTERFACE_LINK_LIBRARIES INTERFACE_COMPILE_OPTIONS
                   INTERFACE_COMPILE_DEFINITIONS INTERFACE_INCLUDE_DIRECTORIES)
    get_target_property(values ${target} ${property})
    if(values)
      list(APPEND deps ${values})
    endif()
  endforeach()
  foreach(dep IN LISTS deps)
    # Also the targets named inside generator expressions, e.g. $<LINK_ONLY:torch_cpu> or
    # $<TARGET_PROPERTY:torch_cpu,INTERFACE_COMPILE_OPTIONS>.
    string(REGEX MATCHALL "[A-Za-z0-9_.+-]+(::[A-Za-z0-9_.+-]+)*" names "${dep}")
    foreach(name IN LISTS names)
      _torchloom_make_global(${name})
    endforeach()
  endforeach()
endfunction()

macro(torchloom_find_dependencies)
  set(_tl_required "")
  if("${ARGN}" STREQUAL "REQUIRED")
    set(_tl_required REQUIRED)
  endif()
  set(TORCHLOOM_DEPENDENCIES_FOUND OFF)
  set(TORCHLOOM_CUDA_FOUND OFF)
  if(NOT TARGET torch)
    find_package(Torch ${_tl_required} QUIET)
  endif()
  if(NOT TARGET Boost::headers)
    # Debian 12's default Boost is 1.74 (no Describe); 1.81 installs beside it, and a
    # versioned find_package picks it among the two.
    find_package(Boost 1.77 QUIET CONFIG COMPONENTS headers)
    if(NOT Boost_FOUND AND _tl_required)
      message(FATAL_ERROR "torchloom needs Boost >= 1.77 for Boost.Describe "
                          "(Debian 12: apt-get install libboost1.81-dev)")
    endif()
  endif()
  if(TARGET torch AND TARGET Boost::headers)
    set(TORCHLOOM_DEPENDENCIES_FOUND ON)
    if(NOT PROJECT_IS_TOP_LEVEL)
      foreach(_tl_target IN LISTS TORCH_LIBRARIES ITEMS Boost::headers)
        _torchloom_make_global(${_tl_target})
      endforeach()
    endif()
    if(TARGET torch_cuda OR TARGET c10_cuda)
      find_package(CUDAToolkit QUIET)
      if(CUDAToolkit_FOUND)
        set(TORCHLOOM_CUDA_FOUND ON)
      endif()
    endif()
  endif()
endmacro()
