"""The static files' build (controlplane/static_build.py, controlplane/common/staticfiles.py; issue 35): the
partial plotly.js bundle pinned at the pip package's version and checked against its pinned integrity, the
full bundle with a warning where npm cannot give it, and pages that render (under plain names) with no build
at all or a file missing from the build."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from django.test import Client, override_settings

from controlplane import static_build
from controlplane.common.staticfiles import BuiltStaticFilesStorage


def pip_bundle() -> bytes:
    return (static_build.pip_plotly_dir() / "plotly.min.js").read_bytes()


@pytest.fixture
def bundle_dir(tmp_path, monkeypatch):
    """ensure_plotly_bundle writing under tmp_path instead of the checkout's var/."""
    monkeypatch.setattr(static_build, "PLOTLY_DIR", tmp_path / "plotly" / "bundle")
    monkeypatch.setattr(static_build, "PLOTLY_INFO", tmp_path / "plotly" / "bundle.json")
    return tmp_path / "plotly" / "bundle"


def test_the_partial_bundle_is_pinned_at_the_pip_packages_plotly_js_version():
    version = static_build.bundle_version(pip_bundle())
    assert version in static_build.PARTIAL_INTEGRITY, (
        f"the pip plotly package ships plotly.js {version}: pin {static_build.PARTIAL_PACKAGE}@{version}'s "
        "integrity (npm view ... dist.integrity) in PARTIAL_INTEGRITY"
    )
    assert static_build.PARTIAL_INTEGRITY[version].startswith("sha512-")


def test_without_npm_the_pages_get_the_full_bundle_with_a_warning(bundle_dir, monkeypatch):
    monkeypatch.setattr(static_build.shutil, "which", lambda name: None)
    said: list[str] = []
    info = static_build.ensure_plotly_bundle(log=said.append)
    assert info["bundle"] == "full" and info["reason"] == "npm is not installed"
    assert (bundle_dir / "plotly.min.js").read_bytes() == pip_bundle()
    assert len(said) == 1 and "WARNING" in said[0] and "full bundle" in said[0]
    # npm is not asked again on every start while the full bundle is the one it could not replace
    assert static_build.ensure_plotly_bundle(log=said.append) == info and len(said) == 1


def tarball(payload: bytes) -> bytes:
    """A package tarball as npm packs one, holding ``payload`` as the partial bundle."""
    data = io.BytesIO()
    with gzip.GzipFile(fileobj=data, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        member = tarfile.TarInfo(f"package/{static_build.PARTIAL_FILE}")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    return data.getvalue()


def fake_npm_pack(tgz: bytes):
    """A stand-in for `npm pack` that leaves ``tgz`` in its --pack-destination."""

    def run(cmd, **kwargs):
        destination = Path(cmd[cmd.index("--pack-destination") + 1])
        (destination / "plotly.js-cartesian-dist-min.tgz").write_bytes(tgz)
        return subprocess.CompletedProcess(cmd, 0, "[]", "")

    return run


def bundle_named(version: str, code: str) -> bytes:
    return f"/**\n* plotly.js (cartesian - minified) v{version}\n*/ {code}".encode()


def test_a_tarball_that_is_not_the_pinned_one_is_refused(bundle_dir, monkeypatch):
    monkeypatch.setattr(static_build.shutil, "which", lambda name: "/usr/bin/npm")
    version = static_build.bundle_version(pip_bundle())
    monkeypatch.setattr(
        static_build.subprocess, "run", fake_npm_pack(tarball(bundle_named(version, "alert(1)")))
    )
    info = static_build.ensure_plotly_bundle(log=lambda line: None)
    assert info["bundle"] == "full" and "is not the pinned" in info["reason"], info
    assert (bundle_dir / "plotly.min.js").read_bytes() == pip_bundle()


def test_the_pinned_tarball_gives_the_partial_bundle(bundle_dir, monkeypatch):
    version = static_build.bundle_version(pip_bundle())
    partial = bundle_named(version, "window.Plotly = {};")
    tgz = tarball(partial)
    monkeypatch.setattr(static_build.shutil, "which", lambda name: "/usr/bin/npm")
    monkeypatch.setattr(static_build.subprocess, "run", fake_npm_pack(tgz))
    monkeypatch.setitem(static_build.PARTIAL_INTEGRITY, version, static_build.tarball_integrity(tgz))
    info = static_build.ensure_plotly_bundle(log=lambda line: None)
    assert info["bundle"] == "partial" and info["version"] == version
    assert (bundle_dir / "plotly.min.js").read_bytes() == partial
    assert json.loads(static_build.PLOTLY_INFO.read_text()) == info


def test_the_storage_names_built_files_by_their_hash_and_others_plainly(tmp_path, settings):
    settings.DEBUG = True  # `make run` and the tests' stacks: hashed names all the same
    manifest = {"paths": {"js/a.js": "js/a.0123456789ab.js"}, "version": "1.1", "hash": "x"}
    (tmp_path / "staticfiles.json").write_text(json.dumps(manifest))
    storage = BuiltStaticFilesStorage(location=tmp_path, base_url="/static/")
    assert storage.url("js/a.js") == "/static/js/a.0123456789ab.js"
    assert storage.url("js/new.js") == "/static/js/new.js"  # added since the build: its source serves it
    assert (
        BuiltStaticFilesStorage(location=tmp_path / "none", base_url="/static/").url("js/a.js")
        == "/static/js/a.js"
    )


@pytest.mark.django_db
def test_a_page_renders_without_any_build(tmp_path, alice):
    with override_settings(STATIC_ROOT=tmp_path):  # no manifest: plain names, served from the sources
        browser = Client()
        browser.force_login(alice)
        page = browser.get("/green/")
    assert page.status_code == 200
    assert '<meta name="plotly-src" content="/static/plotly/plotly.min.js">' in page.content.decode()
