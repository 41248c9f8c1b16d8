# A LibTorch from a PyTorch wheel finds its CUDA libraries (cudart, NCCL, cuDNN...) in the
# nvidia-* packages beside it, through its RPATH. Put those folders first in the build RPATH:
# otherwise the linker resolves libtorch_cuda.so's dependencies in a CUDA toolkit's folder (whose
# NCCL may lack symbols torch needs) and the programs load the toolkit's cudart, not torch's.
# Needed whenever the LibTorch has CUDA. Used by the project and by its installed package config.
macro(ampactor_torch_wheel_rpath)
  if((TARGET c10_cuda OR TORCH_CUDA_LIBRARIES) AND TORCH_INSTALL_PREFIX)
    get_filename_component(_ampactor_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
    file(GLOB _ampactor_torch_cuda_libs LIST_DIRECTORIES true "${_ampactor_site}/nvidia/*/lib")
    if(_ampactor_torch_cuda_libs)
      list(PREPEND CMAKE_BUILD_RPATH ${_ampactor_torch_cuda_libs})
    endif()
  endif()
endmacro()
