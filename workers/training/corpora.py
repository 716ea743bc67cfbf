"""A user's corpus and tokenizer: text, JSONL and Parquet files tokenized once into cached token shards.

``data`` is a file or a directory of files; with a tokenizer (``tokenizer.json``, the ``tokenizers``
library) each file is read by its suffix: ``.jsonl`` one document per line (its ``data_field``), ``.parquet``
one per row (the ``data_field`` column, read with pyarrow), ``.npy`` token ids already (a pre-tokenized
shard, used as is), anything else one UTF-8 document per file. Documents are joined with the tokenizer's
end-of-text token and written as ``uint32`` ``.npy`` shards under ``.cann-tokens/<key>/`` beside the data
(``key``: the tokenizer, the field, the split and every file's size and modification time; a change to any
of them tokenizes again, nothing else does). The runtime's loader then reads the shards as it reads any
``.npy`` token files (``workers.training.data``): deterministic, data-parallel-sharded, resumable from one
integer. A validation split holds out the last ``val_fraction`` of the documents.

Without a tokenizer nothing here runs: raw files stay byte tokens, as before.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CACHE = ".cann-tokens"
SHARD_TOKENS = 1 << 24  # 64 MiB of uint32 per shard
ENCODE_BATCH = 512  # documents per encode_batch call
END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>", "<|eot_id|>")


class CorpusError(ValueError):
    """Bad data or tokenizer input; ``field`` names the option (``tokenizer``, ``data``, ``data_field``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def tokenizer_file(path: str | Path) -> Path:
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise CorpusError("tokenizer", f"no tokenizer.json at {path}")
    return file


def load_tokenizer(path: str | Path):
    from tokenizers import Tokenizer

    file = tokenizer_file(path)
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exceptions for a bad file
        raise CorpusError("tokenizer", f"{file} is not a tokenizers tokenizer.json ({exc})") from None


def end_of_text_id(tokenizer, path: str | Path) -> int:
    """The id joining documents: ``tokenizer_config.json``'s ``eos_token`` beside the tokenizer, else the
    first of the usual end-of-text tokens the vocabulary has."""
    config = tokenizer_file(path).parent / "tokenizer_config.json"
    names = []
    if config.is_file():
        try:
            eos = json.loads(config.read_text()).get("eos_token")
            names.append(eos.get("content") if isinstance(eos, dict) else eos)
        except (OSError, ValueError, AttributeError):
            pass
    for name in [n for n in names if n] + list(END_OF_TEXT):
        if (token_id := tokenizer.token_to_id(name)) is not None:
            return token_id
    raise CorpusError(
        "tokenizer",
        f"{tokenizer_file(path)} has no end-of-text token ({', '.join(END_OF_TEXT)}) to join documents with",
    )


def corpus_files(data: str | Path) -> list[Path]:
    from workers.training.data import user_files

    try:
        return user_files(data)
    except FileNotFoundError as exc:
        raise CorpusError("data", str(exc)) from None


def check_corpus(data: str | Path, tokenizer_path: str | Path, data_field: str, vocab_size: int) -> None:
    """What can be known before any rank starts, cheaply: the tokenizer loads and fits the model's
    vocabulary, every JSONL file's first record and every Parquet file have ``data_field``, every
    pre-tokenized shard holds integer ids below the vocabulary. Raises :class:`CorpusError`."""
    tokenizer = load_tokenizer(tokenizer_path)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise CorpusError(
            "tokenizer",
            f"its vocabulary has {size:,} tokens, more than the model's {vocab_size:,} (model.vocab_size)",
        )
    end_of_text_id(tokenizer, tokenizer_path)
    for file in corpus_files(data):
        if file.suffix == ".jsonl":
            with file.open(encoding="utf-8", errors="replace") as f:
                first = next((line for line in f if line.strip()), None)
            if first is not None:
                _field_of(_record(first, file, 1), data_field, file, 1)
        elif file.suffix == ".parquet":
            names = _parquet(file).schema_arrow.names
            if data_field not in names:
                raise CorpusError(
                    "data_field", f"{file} has no column {data_field!r} (columns: {', '.join(names)})"
                )
        elif file.suffix == ".npy":
            ids = _shard(file)
            if ids.size and int(ids.max()) >= vocab_size:
                raise CorpusError(
                    "data", f"{file} holds token id {int(ids.max())}, beyond the vocabulary ({vocab_size:,})"
                )


@dataclass
class PreparedCorpus:
    train: list[Path]
    val: list[Path] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def prepare(
    data: str | Path,
    tokenizer_path: str | Path,
    data_field: str = "text",
    val_fraction: float = 0.0,
    *,
    progress: Callable[[int, int, int], None] | None = None,
) -> PreparedCorpus:
    """The corpus's token shards, tokenized now unless the cache already holds them. ``progress(documents
    done, documents in all, tokens)`` is called as it goes."""
    files = corpus_files(data)
    root = Path(data) if Path(data).is_dir() else Path(data).parent
    text = [f for f in files if f.suffix != ".npy"]
    shards = [f for f in files if f.suffix == ".npy"]
    if not text:  # pre-tokenized shards only: the validation split is the last files
        for f in shards:
            _shard(f)
        held = math.ceil(val_fraction * len(shards)) if val_fraction else 0
        if held and held >= len(shards):
            raise CorpusError(
                "val_fraction", f"{len(shards)} pre-tokenized shard(s): too few to hold some out"
            )
        return PreparedCorpus(train=shards[: len(shards) - held], val=shards[len(shards) - held :])
    tokenizer_json = tokenizer_file(tokenizer_path)
    key = _cache_key(root, files, tokenizer_json, data_field, val_fraction)
    cache = root / CACHE / key
    if not (cache / "manifest.json").is_file():
        _tokenize(files, root, cache, tokenizer_path, data_field, val_fraction, progress)
    manifest = json.loads((cache / "manifest.json").read_text())
    return PreparedCorpus(
        train=[cache / n for n in manifest["train_shards"]],
        val=[cache / n for n in manifest["val_shards"]],
        manifest=manifest,
    )


def _cache_key(
    root: Path, files: list[Path], tokenizer_json: Path, data_field: str, val_fraction: float
) -> str:
    h = hashlib.sha256()
    h.update(hashlib.sha256(tokenizer_json.read_bytes()).digest())
    h.update(json.dumps([data_field, val_fraction]).encode())
    for f in files:
        st = f.stat()
        h.update(json.dumps([f.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns]).encode())
    return h.hexdigest()[:16]


def _record(line: str, file: Path, number: int) -> dict:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise CorpusError("data", f"{file}:{number} is not a JSON line ({exc})") from None
    if not isinstance(record, dict):
        raise CorpusError("data", f"{file}:{number} is not a JSON object")
    return record


def _field_of(record: dict, data_field: str, file: Path, number: int) -> str:
    if data_field not in record:
        raise CorpusError(
            "data_field",
            f"{file}:{number} has no field {data_field!r} (fields: {', '.join(map(str, record))[:200]})",
        )
    value = record[data_field]
    if not isinstance(value, str):
        raise CorpusError(
            "data_field", f"{file}:{number}: {data_field!r} is {type(value).__name__}, not text"
        )
    return value


def _parquet(file: Path):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for an unreadable file vary
        raise CorpusError("data", f"{file} is not a readable Parquet file ({exc})") from None


def _shard(file: Path) -> np.ndarray:
    try:
        ids = np.load(file, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise CorpusError("data", f"{file} is not a readable .npy token shard ({exc})") from None
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise CorpusError(
            "data", f"{file}: a token shard is a 1-d array of integer ids, got {ids.dtype} {ids.shape}"
        )
    return ids


def _count(file: Path) -> int:
    if file.suffix == ".jsonl":
        with file.open("rb") as f:
            return sum(1 for line in f if line.strip())
    if file.suffix == ".parquet":
        return _parquet(file).metadata.num_rows
    return 1


def _documents(files: list[Path], data_field: str) -> Iterator[str]:
    for file in files:
        if file.suffix == ".jsonl":
            with file.open(encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    if line.strip():
                        yield _field_of(_record(line, file, number), data_field, file, number)
        elif file.suffix == ".parquet":
            pf = _parquet(file)
            if data_field not in pf.schema_arrow.names:
                raise CorpusError("data_field", f"{file} has no column {data_field!r}")
            for batch in pf.iter_batches(columns=[data_field]):
                for value in batch.column(0).to_pylist():
                    yield value or ""
        else:
            yield file.read_text(encoding="utf-8", errors="replace")


class _ShardWriter:
    def __init__(self, directory: Path, prefix: str, dtype):
        self.directory, self.prefix, self.dtype = directory, prefix, dtype
        self.buffer: list[np.ndarray] = []
        self.buffered = 0
        self.names: list[str] = []
        self.tokens = 0

    def add(self, ids: np.ndarray) -> None:
        self.buffer.append(ids)
        self.buffered += ids.size
        self.tokens += ids.size
        if self.buffered >= SHARD_TOKENS:
            self.flush()

    def flush(self) -> None:
        if not self.buffered:
            return
        name = f"{self.prefix}-{len(self.names):05d}.npy"
        np.save(self.directory / name, np.concatenate(self.buffer).astype(self.dtype))
        self.names.append(name)
        self.buffer, self.buffered = [], 0


def _tokenize(files, root, cache, tokenizer_path, data_field, val_fraction, progress) -> None:
    tokenizer = load_tokenizer(tokenizer_path)
    eos = end_of_text_id(tokenizer, tokenizer_path)
    text = [f for f in files if f.suffix != ".npy"]
    total = sum(_count(f) for f in text)
    held = math.ceil(val_fraction * total) if val_fraction else 0
    if held and held >= total:
        raise CorpusError(
            "val_fraction",
            f"{total} document(s): too few to hold {val_fraction:.0%} out and train on the rest",
        )
    tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dtype = np.uint32 if tokenizer.get_vocab_size(with_added_tokens=True) >= 1 << 16 else np.uint16
    train, val = _ShardWriter(tmp, "train", dtype), _ShardWriter(tmp, "val", dtype)
    done, batch = 0, []

    def encode(texts: list[str], first: int) -> None:
        for i, enc in enumerate(tokenizer.encode_batch(texts, add_special_tokens=False)):
            writer = val if first + i >= total - held else train
            writer.add(np.asarray([*enc.ids, eos], dtype=np.int64))

    for doc in _documents(text, data_field):
        batch.append(doc)
        if len(batch) == ENCODE_BATCH:
            encode(batch, done)
            done += len(batch)
            batch = []
            if progress is not None:
                progress(done, total, train.tokens + val.tokens)
    if batch:
        encode(batch, done)
        done += len(batch)
    train.flush(), val.flush()
    if progress is not None:
        progress(done, total, train.tokens + val.tokens)
    if not train.tokens:
        raise CorpusError("data", f"{root}: no text to train on")
    manifest = {
        "documents": done,
        "val_documents": held,
        "train_tokens": train.tokens,
        "val_tokens": val.tokens,
        "end_of_text_id": eos,
        "data_field": data_field,
        "tokenizer": str(tokenizer_file(tokenizer_path)),
        "train_shards": train.names,
        "val_shards": val.names,
        "files": [f.relative_to(root).as_posix() for f in files],
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    try:
        os.replace(tmp, cache)  # atomic: another node's rank that tokenized the same corpus wins alike
    except OSError:
        if not (cache / "manifest.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def tokenizer_for(cfg) -> Path | None:
    """The run's tokenizer.json: ``cfg.tokenizer`` (the file or its directory), else ``cfg.hf_model``'s own
    when it has one; None: byte tokens."""
    if cfg.tokenizer:
        return tokenizer_file(cfg.tokenizer)
    if cfg.hf_model and (Path(cfg.hf_model) / "tokenizer.json").is_file():
        return Path(cfg.hf_model) / "tokenizer.json"
    return None


def corpus_for_run(
    cfg, *, local_rank: int, barrier: Callable[[], None], log: Callable[[str], None]
) -> PreparedCorpus | None:
    """The run's token shards (None without a tokenizer: the data are byte tokens or .npy ids, as before).
    Each node's local rank 0 tokenizes (once: the cache), the other ranks wait for it."""
    tokenizer = tokenizer_for(cfg)
    if tokenizer is None:
        return None
    if cfg.data is None:
        raise CorpusError(
            "data", "a tokenizer needs a corpus: give data (text, JSONL, Parquet or .npy shards)"
        )
    last = [0.0]

    def progress(done: int, total: int, tokens: int) -> None:
        import time

        if time.monotonic() - last[0] >= 5 or done == total:
            last[0] = time.monotonic()
            log(f"tokenizing {cfg.data}: {done:,}/{total:,} documents, {tokens:,} tokens")

    if local_rank == 0:
        prepared = prepare(cfg.data, tokenizer, cfg.data_field, cfg.val_fraction, progress=progress)
    barrier()
    if local_rank != 0:
        prepared = prepare(cfg.data, tokenizer, cfg.data_field, cfg.val_fraction)
    return prepared
