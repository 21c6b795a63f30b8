"""A process that writes checkpoints until it is killed (the crash test's victim).

    python -m tests.engine.disk_crash_worker MODEL_DIR CACHE_DIR SEED

Serves random 600-token prompts one after another on the tiny model with the disk tier on,
so every request writes a `cold` checkpoint; prints "saving N" as each save is submitted.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from kvserve.config import KVStoreConfig
from kvserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import VOCAB, make_engine


def main() -> None:
    model_dir, cache_dir, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    engine = make_engine(model_dir, kv_store=KVStoreConfig(directory=cache_dir, max_pending_saves=64))
    rng = random.Random(seed)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    for i in range(10_000):
        prompt = [rng.randrange(VOCAB) for _ in range(600)]
        print(f"saving {i}", flush=True)
        engine.generate([engine.make_request(f"w{seed}-{i}", prompt, params)])


if __name__ == "__main__":
    main()
