#!/usr/bin/env bash
# `megatron serve --engine`: the server test of serve.sh through the generation engine (KV cache,
# concurrent requests batched into one pass), the path --device cuda takes, here on the CPU.
exec bash "$2/tests/cli/serve.sh" "$1" "$2" engine
