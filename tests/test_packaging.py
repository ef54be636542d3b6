"""cache/ and cli/ install as musketeers.cache / musketeers.cli, never as top-level packages."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile

from conftest import REPO

CHECK = ("import importlib.util as u, musketeers.cache.store, musketeers.cli.main, musketeers;"
         "assert u.find_spec('cache') is None and u.find_spec('cli') is None;"
         "print(musketeers.cache.store.__file__)")


def test_editable_install_maps_cache_and_cli():
    spec = importlib.util.find_spec("musketeers.cache")
    assert spec is not None and spec.origin.startswith(str(REPO / "cache"))
    out = subprocess.run([sys.executable, "-c", CHECK], cwd="/", capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().startswith(str(REPO / "cache"))


def test_built_wheel_installs_only_musketeers(tmp_path):
    had_build = (REPO / "build").exists()
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp_path / "dist"), str(REPO)], check=True)
    finally:
        if not had_build:  # setuptools builds in-tree; leave the checkout as it was
            shutil.rmtree(REPO / "build", ignore_errors=True)
    wheel = next((tmp_path / "dist").glob("musketeers-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert "musketeers" in tops and not tops & {"cache", "cli"}
    # the team registry and the ablation grids are data the installed commands read
    assert "musketeers/configs/teams.yaml" in names
    assert "musketeers/configs/ablations/smoke.yaml" in names
    assert "musketeers/configs/tasks/arithmetic.yaml" in names  # the families are task files
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), str(wheel)], check=True)
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(site), "PATH": "/usr/bin"})
    assert out.stdout.strip().startswith(str(site / "musketeers" / "cache"))
