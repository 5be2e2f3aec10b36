"""`llmir serve --ray` options without a cluster: bad combinations, Ray missing, the deployment
options and the merged /metrics text (no Ray needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.errors import InputError
from llmir_core.serve import cluster
from llmir_core.serve.metrics_merge import merge


def _serve(art: Path, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["serve", str(art), *args])
    return r.exit_code, r.stderr if hasattr(r, "stderr") else r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--replicas", "2"), "error: --replicas needs --ray"),
        (("--autoscale", "1,2", "--address", "auto"), "error: --autoscale, --address need --ray"),
        (("--ray", "--replicas", "2", "--autoscale", "1,2"), "not both"),
        (("--ray", "--replicas", "0"), "--replicas must be >= 1, got 0"),
        (("--ray", "--autoscale", "2"), "--autoscale must be MIN,MAX"),
        (("--ray", "--autoscale", "3,2"), "0 <= MIN <= MAX"),
        (("--ray", "--autoscale", "0,0"), "MAX >= 1"),
    ],
)
def test_bad_combinations(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    code, err = _serve(tmp_path, *args)
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], err


def test_ray_missing_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code, err = _serve(tmp_path, "--ray", "--replicas", "2")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "pip install 'llmir[cluster]'" in lines[0]


def test_bad_autoscaling_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cluster.ENV_AUTOSCALING, "[1]")
    with pytest.raises(InputError, match="must be a JSON object"):
        cluster.autoscaling_overrides()
    monkeypatch.setenv(cluster.ENV_AUTOSCALING, "{nope")
    with pytest.raises(InputError, match="is not JSON"):
        cluster.autoscaling_overrides()


def test_deployment_options(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed = cluster.deployment_options(cluster.ClusterSpec(replicas=3, cpus=2.0), 8, 64)
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["max_ongoing_requests"] == 72  # a full replica answers its own 429
    assert fixed["ray_actor_options"] == {"num_cpus": 2.0}
    monkeypatch.setenv(cluster.ENV_AUTOSCALING, '{"upscale_delay_s": 1}')
    auto = cluster.deployment_options(cluster.ClusterSpec(autoscale=(0, 4)), 8, 64)
    assert "num_replicas" not in auto
    assert auto["autoscaling_config"] == {
        "min_replicas": 0,
        "initial_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 8,
        "upscale_delay_s": 1,
    }


def test_merge_labels_every_sample_and_keeps_families_whole() -> None:
    a = (
        "# HELP llmir_queue_depth Requests waiting.\n# TYPE llmir_queue_depth gauge\n"
        "llmir_queue_depth 3\n# HELP h A histogram.\n# TYPE h histogram\n"
        'h_bucket{le="0.1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 0.5\nh_count 2\n'
    )
    b = a.replace("llmir_queue_depth 3", "llmir_queue_depth 0")
    text = merge({"r2": b, "r1": a}, {"r1": {"pid": "11"}, "r2": {"pid": "22"}})
    lines = text.splitlines()
    assert lines[:5] == [
        "# HELP llmir_queue_depth Requests waiting.",
        "# TYPE llmir_queue_depth gauge",
        'llmir_queue_depth{replica="r1"} 3',
        'llmir_queue_depth{replica="r2"} 0',
        "# HELP h A histogram.",
    ]
    assert 'h_bucket{replica="r2",le="+Inf"} 2' in lines
    assert lines.index('h_count{replica="r2"} 2') < lines.index(
        "# HELP llmir_replica_info One per live replica: its process and node."
    )
    assert sum(ln.startswith("# TYPE h ") for ln in lines) == 1
    assert lines[-2:] == [
        'llmir_replica_info{replica="r1",pid="11"} 1',
        'llmir_replica_info{replica="r2",pid="22"} 1',
    ]


def test_build_app_for_a_rayservice() -> None:
    """The application builder of docs/cluster.md's RayService (no cluster needed)."""
    pytest.importorskip("ray.serve", reason="ray[serve] is not installed")
    with pytest.raises(InputError, match="needs args.artifact"):
        cluster.build_app({"replicas": "2"})
    app = cluster.build_app({"artifact": "/models/a", "autoscale": "1,3", "threads": "2"})
    dep = app._bound_deployment  # Ray's Application holds the bound deployment
    assert dep.name == "llmir" and dep.ray_actor_options["num_cpus"] == 2.0
    cfg = dep._deployment_config.autoscaling_config
    assert (cfg.min_replicas, cfg.max_replicas, cfg.target_ongoing_requests) == (1, 3, 8)
    args = dep._replica_config.init_args[0]
    assert args.art_dir == "/models/a" and args.api_key is None and args.key_env == "LLMIR_API_KEY"
