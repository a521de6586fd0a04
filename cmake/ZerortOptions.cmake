# Resolves the AUTO/ON/OFF backend switches into ZR_WITH_CUDA / ZR_WITH_MPI / ZR_WITH_NCCL and
# provides the helpers every folder uses to declare its library target.

function(_zr_check_switch name)
  if(NOT "${${name}}" MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${name} must be AUTO, ON or OFF, not '${${name}}'")
  endif()
endfunction()

macro(zr_resolve_backends)
  _zr_check_switch(ZR_ENABLE_CUDA)
  _zr_check_switch(ZR_ENABLE_MPI)
  _zr_check_switch(ZR_ENABLE_NCCL)

  set(ZR_WITH_CUDA OFF)
  if(NOT ZR_ENABLE_CUDA STREQUAL "OFF")
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      enable_language(CUDA)
      # CMake 3.25 does not know that nvcc 12+ takes C++20; tell it the flag.
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA_STANDARD 20)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      string(APPEND CMAKE_CUDA_FLAGS " --expt-relaxed-constexpr")
      find_package(CUDAToolkit REQUIRED)
      set(ZR_WITH_CUDA ON)
    elseif(ZR_ENABLE_CUDA STREQUAL "ON")
      message(FATAL_ERROR "ZR_ENABLE_CUDA=ON but no nvcc was found (set CMAKE_CUDA_COMPILER)")
    endif()
  endif()

  set(ZR_WITH_MPI OFF)
  if(NOT ZR_ENABLE_MPI STREQUAL "OFF")
    find_package(MPI COMPONENTS C)
    if(MPI_C_FOUND)
      set(ZR_WITH_MPI ON)
      # zerort uses MPI's C API; keep the deprecated C++ bindings out of every translation unit.
      add_compile_definitions(OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
      find_program(ZR_MPIEXEC NAMES mpirun mpiexec REQUIRED)
    elseif(ZR_ENABLE_MPI STREQUAL "ON")
      message(FATAL_ERROR "ZR_ENABLE_MPI=ON but MPI was not found (apt-get install libopenmpi-dev)")
    endif()
  endif()

  set(ZR_WITH_NCCL OFF)
  if(ZR_WITH_CUDA AND NOT ZR_ENABLE_NCCL STREQUAL "OFF")
    find_package(NCCL)
    if(NCCL_FOUND)
      set(ZR_WITH_NCCL ON)
    elseif(ZR_ENABLE_NCCL STREQUAL "ON")
      message(FATAL_ERROR "ZR_ENABLE_NCCL=ON but NCCL was not found (set NCCL_ROOT)")
    endif()
  elseif(ZR_ENABLE_NCCL STREQUAL "ON")
    message(FATAL_ERROR "ZR_ENABLE_NCCL=ON needs CUDA")
  endif()
endmacro()

# zr_library(NAME name FOLDER folder SOURCES ... PUBLIC_HEADERS ... PUBLIC_DEPS ... PRIVATE_DEPS ...):
# one room's library. PUBLIC_HEADERS are the room's part of the embedding API and what they include
# (installed under include/zerort/<folder>/; the rest stay in the source tree), see
# [Note: include paths] in the top CMakeLists.txt and tests/install/public_headers.sh.
function(zr_library)
  cmake_parse_arguments(ARG "" "NAME;FOLDER" "SOURCES;PUBLIC_HEADERS;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(zerort_${ARG_NAME} SHARED ${ARG_SOURCES})
  add_library(zerort::${ARG_NAME} ALIAS zerort_${ARG_NAME})
  set_target_properties(zerort_${ARG_NAME} PROPERTIES EXPORT_NAME ${ARG_NAME}
                        CUDA_SEPARABLE_COMPILATION OFF CUDA_RUNTIME_LIBRARY Shared)
  target_include_directories(zerort_${ARG_NAME} PUBLIC
    $<BUILD_INTERFACE:${ZR_BUILD_INCLUDE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(zerort_${ARG_NAME} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  # Every symbol a library uses comes from the libraries it names: a room that calls one above it
  # (or one it does not link) fails to link, so the layering is the build's, not a convention.
  # (The sanitizers' runtimes are the executables', so their builds leave this out.)
  if(NOT ZR_SANITIZE)
    target_link_options(zerort_${ARG_NAME} PRIVATE "LINKER:--no-undefined")
  endif()
  install(TARGETS zerort_${ARG_NAME} EXPORT zerortTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  if(ARG_PUBLIC_HEADERS)
    install(FILES ${ARG_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zerort/${ARG_FOLDER})
  endif()
endfunction()
