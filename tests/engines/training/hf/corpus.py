"""A local corpus and a tokenizer trained on it in the test (no download): short documents of a small
seeded grammar, as JSONL, plain text and Parquet, and a byte-level BPE ``tokenizer.json``."""

from __future__ import annotations

import json
import random
from pathlib import Path

SUBJECTS = ["the cat", "a dog", "my neighbour", "the old sailor", "a small bird", "the engineer", "our team"]
VERBS = ["sees", "builds", "follows", "paints", "carries", "trains", "finds"]
OBJECTS = ["a red boat", "the long road", "three apples", "a quiet garden", "the new model", "a warm coat"]
ENDINGS = ["every morning.", "in the rain.", "before dinner.", "with great care.", "near the river."]


def documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        sentences = [
            f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}"
            for _ in range(rng.randint(2, 5))
        ]
        docs.append(" ".join(s.capitalize() for s in sentences))
    return docs


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def train_tokenizer(docs: list[str], directory: Path, vocab_size: int = 300) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return directory / "tokenizer.json"
