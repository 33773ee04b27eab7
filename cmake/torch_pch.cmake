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
  foreach(source IN LISTS sources)
    get_filename_component(path "${source}" ABSOLUTE BASE_DIR "${source_dir}")
    if(NOT path MATCHES "\\.(cpp|cc)$")
      continue()
    endif()
    _lockstep_reaches_torch("${path}" reaches)
    if(NOT reaches)
      set_source_files_properties("${source}" PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
      get_filename_component(name "${source}" NAME)
      list(APPEND without "${name}")
    endif()
  endforeach()
  if(without)
    list(LENGTH without count)
    message(STATUS "lockstep: ${target}: torch PCH left off ${count} torch-free sources")
  endif()
endfunction()
