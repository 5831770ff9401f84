#!/usr/bin/env bash
# FlashMLA and FlashInfer MLA for a GPU machine without network access (see docs/perf.md, round 4).
#   bash benchmarks/peers_bundle.sh build     # here, with network and nvcc: fills .peers/ (git-ignored, ~30 MB;
#                                             # FLASHINFER=0: FlashMLA alone, 13 MB, no nvcc; under the 64 MiB carry)
#   source benchmarks/peers_bundle.sh install # there: unpacks .peers/ into /tmp/peers and puts it on PYTHONPATH
# build: downloads the sgl-flash-mla 1.0.0 and apache-tvm-ffi 0.1.15.post2 wheels (cp312, x86-64), installs
# flashinfer-python 0.7.2.post1 locally, compiles its two MLA modules (fa3 = *_sm90, fa2) for sm_90a with nvcc
# and packs the Python files of flashinfer (no CUDA sources but the batch_mla ones) with the two .so files in
# flashinfer/data/aot/<name>/<name>.so, where flashinfer loads prebuilt modules without compiling.
set -e
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case "${1:-}" in
build)
    cd "$here" && mkdir -p .peers/whl /tmp/peers_build && grep -qx '/.peers/' .git/info/exclude 2>/dev/null || echo '/.peers/' >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .peers/whl \
        sgl-flash-mla==1.0.0 apache-tvm-ffi==0.1.15.post2
    if [ "${FLASHINFER:-1}" = 0 ]; then du -sh "$here/.peers"; exit 0; fi  # FlashMLA alone (13 MB): no nvcc build
    python3 -m pip download -q --no-deps -d /tmp/peers_build flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.15.post2
    python3 -m pip install -q --no-deps --target /tmp/peers_build/site /tmp/peers_build/*.whl tqdm einops tabulate
    mkdir -p /tmp/peers_build/stub && echo 'void ddprobe_stub(void){}' > /tmp/peers_build/stub/s.c
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o /tmp/peers_build/stub/libcuda.so /tmp/peers_build/stub/s.c
    PYTHONPATH=/tmp/peers_build/site FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} \
    LIBRARY_PATH=/tmp/peers_build/stub:${CUDA_HOME:-/usr/local/cuda}/lib64 python3 - <<'PY'
import os, shutil, torch
from flashinfer.jit.attention.modules import gen_batch_mla_module
aot = "/tmp/peers_build/site/flashinfer/data/aot"
for backend in ("fa3", "fa2"):
    spec = gen_batch_mla_module(backend, torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, 512, 64, False)
    spec.build()
    os.makedirs(f"{aot}/{spec.name}", exist_ok=True)
    shutil.copy(spec.jit_library_path, f"{aot}/{spec.name}/{spec.name}.so")
    print("built", spec.name)
PY
    cd /tmp/peers_build/site && find flashinfer flashinfer_python-*.dist-info -type f \
        \( -name '*.py' -o -name '*.json' -o -name py.typed -o -path '*/data/aot/*' -o -path '*/dist-info/*' \
           -o -path '*/data/csrc/batch_mla_*' -o -path '*/data/csrc/*.jinja' \) -not -path '*__pycache__*' \
        | tar czf "$here/.peers/flashinfer_slim.tgz" -T -
    ls -la "$here/.peers" "$here/.peers/whl" ;;
install)
    mkdir -p /tmp/peers
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers "$here"/.peers/whl/*.whl
    if [ -f "$here/.peers/flashinfer_slim.tgz" ]; then tar xzf "$here/.peers/flashinfer_slim.tgz" -C /tmp/peers; fi
    export PYTHONPATH=/tmp/peers:$here${PYTHONPATH:+:$PYTHONPATH} ;;
*)
    echo "usage: bash benchmarks/peers_bundle.sh build | source benchmarks/peers_bundle.sh install" >&2
    return 2 2>/dev/null || exit 2 ;;
esac
