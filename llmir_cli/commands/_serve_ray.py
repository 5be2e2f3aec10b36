"""`llmir serve ART --ray`: the options of the Ray Serve branch, checked, and the driver run
(the deployment itself: llmir_core.serve.cluster)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from llmir_core.errors import InputError

from .._render import Ctx

RAY_HELP = "Serve on Ray Serve (pip install 'llmir[cluster]'): see docs/cluster.md."
REPLICAS_HELP = "--ray: replicas, each with its own --max-batch slots and --threads."
AUTOSCALE_HELP = "--ray: MIN,MAX replicas, scaled by Ray Serve on ongoing requests."
ADDRESS_HELP = (
    "--ray: an existing Ray cluster (ray://HOST:10001, or auto; default $RAY_ADDRESS, else a "
    "local one)."
)

RayOpt = Annotated[bool, typer.Option("--ray", help=RAY_HELP)]
ReplicasOpt = Annotated[int | None, typer.Option("--replicas", help=REPLICAS_HELP)]
AutoscaleOpt = Annotated[
    str | None, typer.Option("--autoscale", metavar="MIN,MAX", help=AUTOSCALE_HELP)
]
AddressOpt = Annotated[str | None, typer.Option("--address", help=ADDRESS_HELP)]


def wanted(ray: bool, replicas: int | None, autoscale: str | None, address: str | None) -> bool:
    """Whether to take the Ray branch; one line and exit 2 for a bad combination."""
    if not ray:
        given = [
            n for n, v in (("--replicas", replicas), ("--autoscale", autoscale)) if v is not None
        ]
        given += ["--address"] if address else []  # (RAY_ADDRESS alone is no request for Ray)
        if given:
            raise InputError(f"{', '.join(given)} need{'s' * (len(given) == 1)} --ray")
        return False
    if replicas is not None and autoscale is not None:
        raise InputError("give --replicas N or --autoscale MIN,MAX, not both")
    if replicas is not None and replicas < 1:
        raise InputError(f"--replicas must be >= 1, got {replicas}")
    return True


def serve_ray(
    ctx: Ctx,
    artifact: Path,
    cluster: tuple[int | None, str | None, str | None],
    address_port: tuple[str, int],
    open_opts: dict[str, Any],
    api_key: str | None,
    pages: dict[str, Path | None],
) -> None:
    """Run the Ray Serve driver; exit 130 after Ctrl-C, 0 after SIGTERM.
    cluster: (--replicas, --autoscale, --address); pages: the Playground's files."""
    from llmir_core.serve import cluster as rc
    from llmir_core.serve.playground import collect
    from llmir_core.targets import read_manifest

    replicas, autoscale, address = cluster
    threads = open_opts.get("threads")
    spec = rc.ClusterSpec(
        replicas=replicas or 1,
        autoscale=rc.parse_autoscale(autoscale) if autoscale else None,
        address=address or os.environ.get("RAY_ADDRESS") or None,
        host=address_port[0],
        port=address_port[1],
        cpus=float(threads or 1),
    )
    if spec.autoscale:
        rc.autoscaling_overrides()  # a bad LLMIR_RAY_AUTOSCALING fails before Ray starts
    rc.require_ray()
    _precheck(artifact, open_opts)
    files = {k: str(v) if v is not None else None for k, v in pages.items()}
    playground = collect(str(artifact), read_manifest(str(artifact)), **files)
    args = rc.ReplicaArgs(str(artifact.resolve()), open_opts, api_key, playground)
    slots = (open_opts["max_batch"], open_opts["max_queue"])
    sig = rc.run(args, spec, slots, ctx.log)
    ctx.log("stopped: the replicas drained and shut down")
    if sig == signal.SIGINT:
        raise typer.Exit(130)


def _precheck(artifact: Path, o: dict[str, Any]) -> None:
    """What open_served_model checks before it loads, here, so a bad option is exit 2 before a
    cluster starts (the replicas hash the files)."""
    from llmir_core.runtime.chat_template import template_timeout
    from llmir_core.runtime.kv_budget import choose_context
    from llmir_core.targets import read_manifest

    if o["max_queue"] < 0:
        raise InputError(f"--max-queue must be >= 0, got {o['max_queue']}")
    if o["chunk"] < 1:
        raise InputError(f"--prefill-chunk must be >= 1, got {o['chunk']}")
    template_timeout(o["template_timeout_s"])
    choose_context(read_manifest(str(artifact)), o["max_batch"], o["max_context"])
