"""The kernel-name rules (ddprobe/kernel_classes.py) on real names: as SGLang, vLLM, FlashInfer, FlashMLA, NCCL,
cuBLAS, PyTorch and ddprobe's own engine write them into torch-profiler traces."""
import re

import pytest

from ddprobe import verify_paths
from ddprobe.kernel_classes import CLASSES, RULES, classify

REAL = [
    # SGLang's Triton attention backend (extend = target verify, decode = split-K + merge)
    ("_fwd_kernel", "attention", "verify"),
    ("_fwd_grouped_kernel_stage1", "attention", "decode"),
    ("_fwd_kernel_stage1", "attention", "decode"),
    ("_fwd_kernel_stage2", "attention", "merge"),
    # FlashMLA (the sgl-flash-mla fork and upstream)
    ("void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::bfloat16_t, "
     "512>, true>(Flash_fwd_mla_params)", "attention", "decode"),
    ("void flash::flash_fwd_splitkv_mla_combine_kernel<cutlass::bfloat16_t, float, 512, 32>(Flash_fwd_mla_params)",
     "attention", "merge"),
    # FlashInfer
    ("void flashinfer::mla::BatchMLAPagedAttentionKernel<flashinfer::mla::KernelTraits<true, 2u, 512u, 64u, 64u, "
     "64u, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, int>, flashinfer::MLAParams>", "attention", "decode"),
    ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<...>>", "attention", "decode"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, "
     "__nv_bfloat16*, unsigned int, unsigned int, float)", "norm_elementwise", ""),
    # vLLM
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
     "__nv_bfloat16*, int, int)", "communication", ""),
    ("void sglang::cross_device_reduce_1stage<__half, 8>(sglang::RankData*, sglang::RankSignals, sglang::Signal*, "
     "__half*, int, int)", "communication", ""),
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 2>(c10::BFloat16*, c10::BFloat16 const*, long, "
     "c10::BFloat16 const*, float, int, int)", "norm_elementwise", ""),
    ("void vllm::concat_and_cache_mla_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(...)",
     "attention", "kv-write"),
    ("fused_moe_kernel", "moe", ""),
    ("void vllm::moe::topkGatingSoftmax<8, 64, 4, 16, int>(float const*, bool const*, float*, int, int*, int*, int, "
     "int, int)", "moe", ""),
    ("void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned "
     "long, int*)", "moe", ""),
    ("kernel_unified_attention_2d", "attention", "decode"),
    # NCCL
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)", "communication", ""),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "communication", ""),
    # cuBLAS / CUTLASS dense GEMMs
    ("nvjet_tst_128x64_64x8_2x1_v_bz_coopA_TNN", "gemm", ""),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__"
     "5x_cublas", "gemm", ""),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "gemm", ""),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(...)", "gemm", ""),
    # SGLang's speculative decoding kernels (sgl-kernel)
    ("void verify_tree_greedy<int, long>(int*, int*, int*, long*, long*, long*, int*, int, int, int, int)",
     "sampling_tree", ""),
    ("void build_tree_efficient(long*, int*, long*, long*, long*, long*, int, int, int, int)", "sampling_tree", ""),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)2, "
     "(cub::BlockReduceAlgorithm)2, 4u, false, float, int>(...)", "sampling_tree", ""),
    # PyTorch
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> "
     ">(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)", "norm_elementwise", ""),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, "
     "long, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)", "sampling_tree",
     ""),
    ("Memcpy DtoH (Device -> Pinned)", "other", ""),
    ("Memset (Device)", "other", ""),
    # ddprobe's engine (its kernels, by the names they are compiled under)
    ("_paged_verify_kernel", "attention", "verify"),
    ("_split_prefix_kernel", "attention", "verify"),
    ("ddp_seesaw_bf16", "attention", "verify"),
    ("ws_tail_kernel", "attention", "verify"),
    ("_merge_kernel", "attention", "verify"),
    ("_moe_route", "moe", ""),
    ("_moe_gemm_gate_up", "moe", ""),
    ("_tree_build", "sampling_tree", ""),
    # a CPU-only engine's operators
    ("aten::linear", "gemm", ""),
    ("aten::rms_norm", "norm_elementwise", ""),
]


@pytest.mark.parametrize("name,cls,role", REAL, ids=[n[:40] for n, _, _ in REAL])
def test_real_names(name, cls, role):
    m = classify(name)
    assert (m.cls, m.role) == (cls, role), f"{name}: {m}"


def test_rules_name_known_classes_and_compile():
    for r in RULES:
        assert r.cls in CLASSES
        re.compile(r.pattern)
    assert classify("some_kernel_nobody_knows").cls == "other"


def test_every_own_path_kernel_is_attention():
    """Each verify path's kernels (verify_paths' ncu_regex, the one place they are named) classify as attention."""
    names = {"paged": "_paged_decode_split", "split": "_merge_flat_kernel", "split_ws": "ddp_merge_bf16",
             "sglang": "_fwd_kernel", "flashmla": "flash_fwd_splitkv_mla_kernel"}
    for p in verify_paths.PATHS:
        if p.ncu_regex:
            assert re.search(p.ncu_regex, names[p.name]), p.name
            assert classify(names[p.name]).cls == "attention", p.name
