"""Build hooks for dsflash.

1. The top-level folders of DESIGN.md (model/, kvcache/, ...) are installed as
   subpackages of `dsflash` (dsflash.model, dsflash.kvcache, ...), so the repository
   keeps the contract's layout while the installed names stay namespaced.
2. The gRPC stubs are generated from protos/ into dsflash/v1/ whenever setup.py runs
   (every regular or editable install does); they are never committed.
"""

import os
import pathlib

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).parent
TOP_LEVEL = ["model", "kvcache", "prefill_worker", "decode_worker", "gateway"]


def generate_stubs() -> None:
    try:
        from grpc_tools import protoc  # build requirement, see pyproject.toml

        import grpc_tools
    except ImportError:  # a --no-build-isolation install on a machine without grpcio-tools
        print("warning: grpcio-tools missing: gRPC stubs not generated (the tiers need them)")
        return

    proto_root = ROOT / "protos"
    protos = sorted(str(p.relative_to(proto_root)) for p in proto_root.rglob("*.proto"))
    if not protos:
        return
    out = ROOT / "dsflash" / "v1"
    out.mkdir(parents=True, exist_ok=True)
    (out / "__init__.py").write_text('"""Generated gRPC stubs (from protos/dsflash/v1). Do not edit."""\n')
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{proto_root}", f"-I{well_known}", f"--python_out={ROOT}", f"--grpc_python_out={ROOT}",
            f"--pyi_out={ROOT}", *protos]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {protos}")


def package_map() -> tuple[list[str], dict[str, str]]:
    packages = ["dsflash", "dsflash.v1"] + [f"dsflash.{p}" for p in find_packages(where="dsflash") if p != "v1"]
    package_dir = {"dsflash": "dsflash"}
    for top in TOP_LEVEL:
        package_dir[f"dsflash.{top}"] = top
        packages.append(f"dsflash.{top}")
        packages += [f"dsflash.{top}.{sub}" for sub in find_packages(where=top)]
    return packages, package_dir


generate_stubs()
packages, package_dir = package_map()
setup(packages=packages, package_dir=package_dir)
