"""The static files the pages load, built once per change of their sources (issue 35: every chart page
loaded the 4.85 MB ``plotly.min.js`` uncompressed, with ``Cache-Control: max-age=0``).

Two steps, both cached, run by ``make run`` (``controlplane.stack``), the tests' stacks and the benches'
before daphne starts (``manage.py build_static``):

1. :func:`ensure_plotly_bundle`: a partial plotly.js bundle with the traces the pages draw. The pip
   ``plotly`` wheel ships only the full bundle (``package_data/plotly.min.js``, every trace type, 4.85 MB),
   so the partial one comes from npm: ``plotly.js-cartesian-dist-min`` at the plotly.js version of the pip
   package, its tarball checked against the sha512 pinned here. Our traces are ``scatter``, ``bar`` and
   ``heatmap`` (``frontend/static/js``); the cartesian bundle (1.42 MB) is the smallest published one with
   all three (``basic``, 1.12 MB, has no heatmap). A bundle of exactly those three would need plotly.js's
   sources and its build toolchain for ~0.3 MB more. Without npm, or offline, the full bundle of the pip
   package is used, with a warning: the pages work the same, only load more.
2. :func:`build_static`: ``collectstatic`` into ``STATIC_ROOT`` with
   ``controlplane.common.staticfiles.BuiltStaticFilesStorage`` (content-hashed names, served with a
   ten-year ``immutable`` Cache-Control by WhiteNoise; gzip and Brotli copies beside each), skipped while
   the sources are those of the last build (their names, sizes and times: a few milliseconds).

No Django at module level: ``settings`` imports this module for its paths.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the build's products belong to this checkout, not to a deployment's data (CANN_TRAIN_VAR_DIR differs per
# test stack and bench): every stack started from the checkout serves the same build
BUILD_DIR = ROOT / "var"
STATIC_ROOT = BUILD_DIR / "static"
PLOTLY_DIR = BUILD_DIR / "plotly" / "bundle"  # holds plotly.min.js: the bundle the pages get
PLOTLY_INFO = BUILD_DIR / "plotly" / "bundle.json"  # which one it is, and why

# the partial bundle: package, version and the sha512 of its npm tarball (npm's "integrity" field, read
# from `npm view plotly.js-cartesian-dist-min@3.7.0 dist.integrity`), one row per plotly.js version
PARTIAL_PACKAGE = "plotly.js-cartesian-dist-min"
PARTIAL_FILE = "plotly-cartesian.min.js"
PARTIAL_INTEGRITY = {
    "3.7.0": "sha512-kfQjcAXXByRlskP8JsrlGYRPOvB+kOehZk/qBNewgr9SOMEnBN5nwEnUGOAQ0EEgYdQX51z3VZ81aBnDgSr9Bw==",
}
NPM_TIMEOUT_S = 120
NPM_RETRY_AFTER_S = 3600  # after a failed fetch (offline), the next builds use the full bundle this long
BUILD_VERSION = 1  # part of the sources' fingerprint: raise it when the storage's output changes
_VERSION_LINE = re.compile(rb"plotly\.js(?: \([\w -]+\))? v(\d+\.\d+\.\d+)")


def pip_plotly_dir() -> Path:
    """The pip ``plotly`` package's ``package_data``: the full bundle (and files the pages never load)."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data"


def bundle_version(data: bytes) -> str | None:
    """The plotly.js version a bundle's header names (``* plotly.js (cartesian - minified) v3.7.0``)."""
    found = _VERSION_LINE.search(data[:400])
    return found.group(1).decode() if found else None


def plotly_dir() -> Path:
    """Where the pages' ``plotly/plotly.min.js`` is found (``settings.STATICFILES_DIRS``): :data:`PLOTLY_DIR`,
    holding the pip package's full bundle until :func:`ensure_plotly_bundle` puts the partial one there (in
    place, so a process whose settings are loaded already collects the new one). The pip package's own
    directory where ``var/`` cannot be written."""
    target = PLOTLY_DIR / "plotly.min.js"
    if not target.exists():
        try:
            _write_atomically(target, (pip_plotly_dir() / "plotly.min.js").read_bytes())
        except OSError:
            return pip_plotly_dir()
    return PLOTLY_DIR


def tarball_integrity(data: bytes) -> str:
    """npm's ``integrity`` of a tarball (Subresource Integrity form: ``sha512-<base64>``)."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def fetch_partial_bundle(version: str, integrity: str) -> bytes:
    """``npm pack`` the partial bundle at ``version`` (npm's cache first); its tarball must have the pinned
    ``integrity``. Returns the bundle's bytes; raises RuntimeError saying why not."""
    npm = shutil.which("npm")
    if not npm:
        raise RuntimeError("npm is not installed")
    with tempfile.TemporaryDirectory(prefix="plotly-npm-") as tmp:
        cmd = [
            npm, "pack", f"{PARTIAL_PACKAGE}@{version}", "--pack-destination", tmp, "--json",
            "--prefer-offline", "--no-fund", "--no-audit", "--fetch-retries=1", "--loglevel=error",
        ]  # fmt: skip
        env = {**os.environ, "npm_config_update_notifier": "false"}
        try:
            done = subprocess.run(
                cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=NPM_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"npm pack took over {NPM_TIMEOUT_S} s (offline?)") from exc
        if done.returncode != 0:
            raise RuntimeError(f"npm pack failed: {(done.stderr or done.stdout).strip()[-300:]}")
        tarballs = list(Path(tmp).glob("*.tgz"))
        if len(tarballs) != 1:
            raise RuntimeError(f"npm pack left {len(tarballs)} tarballs")
        data = tarballs[0].read_bytes()
    if (got := tarball_integrity(data)) != integrity:
        raise RuntimeError(
            f"{PARTIAL_PACKAGE}@{version}: tarball integrity {got} is not the pinned {integrity}"
        )
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile(f"package/{PARTIAL_FILE}")
        if member is None:
            raise RuntimeError(f"{PARTIAL_PACKAGE}@{version} has no {PARTIAL_FILE}")
        return member.read()


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def ensure_plotly_bundle(*, log: Callable[[str], None] = print) -> dict:
    """Put the pages' plotly.js in :data:`PLOTLY_DIR`: the partial bundle at the pip package's plotly.js
    version, else that package's full bundle (with a warning). Returns what :data:`PLOTLY_INFO` says."""
    full = pip_plotly_dir() / "plotly.min.js"
    with open(full, "rb") as f:
        version = bundle_version(f.read(400))
    info = json.loads(PLOTLY_INFO.read_text()) if PLOTLY_INFO.exists() else {}
    target = PLOTLY_DIR / "plotly.min.js"
    if target.exists() and info.get("version") == version:
        if info.get("bundle") == "partial":
            return info
        if (
            time.time() - info.get("tried_at", 0) < NPM_RETRY_AFTER_S
            and info.get("full_size") == full.stat().st_size
        ):
            return info  # the full bundle, npm failed a moment ago: not again on every start
    integrity = PARTIAL_INTEGRITY.get(version or "")
    try:
        if integrity is None:
            raise RuntimeError(
                f"no pinned {PARTIAL_PACKAGE} for plotly.js {version} (the pip plotly package's): add its "
                f"integrity to PARTIAL_INTEGRITY in {Path(__file__).name}"
            )
        data = fetch_partial_bundle(version, integrity)
        if bundle_version(data) != version:
            raise RuntimeError(f"{PARTIAL_FILE} does not say plotly.js v{version}")
        _write_atomically(target, data)
        info = {"bundle": "partial", "package": PARTIAL_PACKAGE, "version": version, "integrity": integrity}
        log(f"static: plotly.js {version} partial bundle ({PARTIAL_PACKAGE}, {len(data) / 1e6:.2f} MB)")
    except RuntimeError as exc:
        _write_atomically(target, full.read_bytes())
        info = {
            "bundle": "full", "version": version, "reason": str(exc), "tried_at": time.time(),
            "full_size": full.stat().st_size,
        }  # fmt: skip
        log(
            f"static: WARNING: serving plotly.js's full bundle ({full.stat().st_size / 1e6:.2f} MB, from the pip "
            f"plotly package): the partial one could not be fetched: {exc}"
        )
    _write_atomically(PLOTLY_INFO, json.dumps(info, indent=1).encode())
    return info


def sources_fingerprint() -> str:
    """What the build is made of: every file the static finders list (name, size, time) and the storage's
    version. Needs Django's settings."""
    from django.conf import settings
    from django.contrib.staticfiles import finders

    digest = hashlib.sha256(f"{BUILD_VERSION}|{settings.STORAGES['staticfiles']['BACKEND']}".encode())
    rows = []
    for finder in finders.get_finders():
        for path, storage in finder.list(["CVS", ".*", "*~"]):
            st = os.stat(storage.path(path))
            rows.append(f"{getattr(storage, 'prefix', None) or ''}/{path}|{st.st_size}|{st.st_mtime_ns}")
    for row in sorted(rows):
        digest.update(row.encode() + b"\n")
    return digest.hexdigest()


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """One build at a time on this checkout (the tests' processes and ``make run`` share ``var/static``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_static(*, log: Callable[[str], None] = print) -> dict:
    """Build ``STATIC_ROOT`` unless it is the build of the current sources. Needs Django's settings;
    returns what was done (``built``, ``seconds``, the plotly bundle)."""
    from django.conf import settings
    from django.core.management import call_command

    if not settings.STATIC_ROOT:
        return {"built": False, "reason": "no STATIC_ROOT: static files served from their sources"}
    root = Path(settings.STATIC_ROOT)
    stamp = root.with_name(root.name + ".build.json")
    t0 = time.perf_counter()
    with _build_lock(root.with_name(root.name + ".lock")):
        plotly = ensure_plotly_bundle(log=log)
        fingerprint = sources_fingerprint()
        done = json.loads(stamp.read_text()) if stamp.exists() else {}
        if done.get("fingerprint") == fingerprint and (root / "staticfiles.json").exists():
            return {"built": False, "seconds": time.perf_counter() - t0, "plotly": plotly}
        stamp.unlink(missing_ok=True)
        call_command("collectstatic", interactive=False, verbosity=0)
        seconds = time.perf_counter() - t0
        _write_atomically(
            stamp, json.dumps({"fingerprint": fingerprint, "seconds": round(seconds, 2)}).encode()
        )
    log(f"static: built {root} in {seconds:.1f} s (plotly.js: {plotly['bundle']} bundle)")
    return {"built": True, "seconds": seconds, "plotly": plotly}
