# The precompiled torch header, only where torch is included.
#
# <torch/torch.h> precompiled is a 570 MB file that every translation unit
# using it loads first: it saves 9 to 14 s on a file that includes torch,
# and costs 8 to 16 s on one that does not (measured on 2 cores: a test that
# only runs the lockstep binary took 26 s with it, 9 s without). So
# lockstep_use_pch(target) gives the header to the target's sources whose
# own includes, followed through the project's headers, reach a torch,
# ATen or c10 header, and leaves it off the others. A scan that misses an
# include costs build time, never correctness: every source compiles either
# way.
#
# Each torch translation unit also pays about 12 s of its own for torch's
# inline code, however small the file (trainer.cpp, evaluate.cpp and
# fault_hooks.cpp: 52 s of compiling one by one, 26 s as one unit). So a
# target's torch sources are compiled in unity groups of up to
# LOCKSTEP_UNITY_BATCH (default 4; 1 turns it off), which keeps enough units
# for two cores to share. Sources in one group share a unit: names in their
# anonymous namespaces must differ.
set(LOCKSTEP_UNITY_BATCH 4 CACHE STRING "torch sources per unity unit (1: no unity build)")
if(NOT LOCKSTEP_UNITY_BATCH MATCHES "^[1-9][0-9]*$")
  message(FATAL_ERROR "LOCKSTEP_UNITY_BATCH = '${LOCKSTEP_UNITY_BATCH}': allowed are whole numbers "
                      "from 1 (each torch source on its own) up; the default is 4")
endif()

# Sets `out` to ON when `file` includes torch, directly or through a project header.
function(_lockstep_reaches_torch file out)
  get_property(known GLOBAL PROPERTY "lockstep_torch_scan:${file}" SET)
  if(known)
    get_property(answer GLOBAL PROPERTY "lockstep_torch_scan:${file}")
    set(${out} ${answer} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "lockstep_torch_scan:${file}" OFF)  # include cycles end here
  set(answer OFF)
  if(EXISTS "${file}")
    file(STRINGS "${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    foreach(line IN LISTS includes)
      if(line MATCHES "<(torch|ATen|c10)/")
        set(answer ON)
        break()
      endif()
      if(line MATCHES "\"([^\"]+)\"")
        set(name "${CMAKE_MATCH_1}")
        get_filename_component(here "${file}" DIRECTORY)
        foreach(root "${here}" "${PROJECT_SOURCE_DIR}" "${PROJECT_SOURCE_DIR}/tests")
          if(EXISTS "${root}/${name}")
            _lockstep_reaches_torch("${root}/${name}" nested)
            if(nested)
              set(answer ON)
            endif()
            break()
          endif()
        endforeach()
        if(answer)
          break()
        endif()
      endif()
    endforeach()
  endif()
  set_property(GLOBAL PROPERTY "lockstep_torch_scan:${file}" ${answer})
  set(${out} ${answer} PARENT_SCOPE)
endfunction()

function(lockstep_use_pch target)
  target_precompile_headers(${target} REUSE_FROM lockstep_pch)
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(without "")
  set(with 0)
  foreach(source IN LISTS sources)
    get_filename_component(path "${source}" ABSOLUTE BASE_DIR "${source_dir}")
    if(NOT path MATCHES "\\.(cpp|cc)$")
      continue()
    endif()
    _lockstep_reaches_torch("${path}" reaches)
    if(reaches)
      math(EXPR group "${with} / ${LOCKSTEP_UNITY_BATCH}")
      set_source_files_properties("${source}" PROPERTIES UNITY_GROUP "torch${group}")
      math(EXPR with "${with} + 1")
    else()
      set_source_files_properties("${source}" PROPERTIES SKIP_PRECOMPILE_HEADERS ON
                                                         SKIP_UNITY_BUILD_INCLUSION ON)
      get_filename_component(name "${source}" NAME)
      list(APPEND without "${name}")
    endif()
  endforeach()
  if(with GREATER 1 AND LOCKSTEP_UNITY_BATCH GREATER 1)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
  endif()
  if(without)
    list(LENGTH without count)
    message(STATUS "lockstep: ${target}: torch PCH left off ${count} torch-free sources")
  endif()
endfunction()
