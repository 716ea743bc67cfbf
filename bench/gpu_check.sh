#!/usr/bin/env bash
# The one prepared script for a machine with an NVIDIA GPU (the device tool): <= 8 minutes, figures printed
# side by side (bench/gpu_check.py says what each part measures). Needs torch with CUDA, transformers,
# tokenizers, safetensors and nvidia-ml-py; no Django, no network. Usage: bash bench/gpu_check.sh [--json]
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
$PY -c "import torch, transformers, safetensors, tokenizers" 2>/dev/null || $PY -m pip install -q safetensors tokenizers nvidia-ml-py >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
timeout 480 $PY bench/gpu_check.py --device cuda "$@"
