# PyPI's torch wheel ships, inside its include folder, the headers of the
# fmt (12) and protobuf (3.13) it was built with. Beside them lockstep uses
# Debian's spdlog, built against Debian's fmt 9, and gRPC with Debian's
# protobuf 3.21: a compiler that finds the wheel's copies first builds
# spdlog and the generated protocol code against the wrong library. So the
# torch targets get a view of that include folder without fmt/ and google/
# (a folder of links, made at configure time); every other header is the
# wheel's own. Debian's LibTorch 1.13 has no such copies and is left alone.
function(lockstep_torch_include_view)
  set(shadowing fmt google)
  set(original "")
  foreach(dir ${TORCH_INCLUDE_DIRS})
    foreach(name ${shadowing})
      if(IS_DIRECTORY "${dir}/${name}")
        set(original "${dir}")
      endif()
    endforeach()
  endforeach()
  if(original STREQUAL "")
    return()
  endif()
  set(view "${CMAKE_BINARY_DIR}/torch-include")
  file(REMOVE_RECURSE "${view}")
  file(MAKE_DIRECTORY "${view}")
  file(GLOB entries RELATIVE "${original}" "${original}/*")
  foreach(entry ${entries})
    if(NOT entry IN_LIST shadowing)
      file(CREATE_LINK "${original}/${entry}" "${view}/${entry}" SYMBOLIC)
    endif()
  endforeach()
  file(REAL_PATH "${original}" original_real)
  # The same folder may be spelt two ways (TorchConfig's prefix, the
  # targets' import prefix): compared by real path.
  function(replaced_dirs out)
    set(result "")
    foreach(dir ${ARGN})
      set(real "")
      if(IS_DIRECTORY "${dir}")
        file(REAL_PATH "${dir}" real)
      endif()
      if(real STREQUAL original_real)
        list(APPEND result "${view}")
      else()
        list(APPEND result "${dir}")
      endif()
    endforeach()
    set(${out} "${result}" PARENT_SCOPE)
  endfunction()
  # Every imported target that names the folder: torch's own, and those
  # its config made (CUDA's, ...).
  get_property(targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(target ${targets})
    get_target_property(aliased ${target} ALIASED_TARGET)
    if(NOT aliased)
      get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
      if(dirs)
        replaced_dirs(dirs ${dirs})
        set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${dirs}")
      endif()
    endif()
  endforeach()
  replaced_dirs(dirs ${TORCH_INCLUDE_DIRS})
  set(TORCH_INCLUDE_DIRS "${dirs}" PARENT_SCOPE)
  message(STATUS "lockstep: LibTorch's include folder ${original} carries its own ${shadowing}: "
                 "compiled against ${view}, the same without them (cmake/torch_include_view.cmake)")
endfunction()
