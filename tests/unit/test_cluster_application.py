"""The Serve application `kvserve cluster` and the KubeRay manifest build (no cluster started)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray.serve", reason="kvserve cluster needs Ray Serve: pip install 'kvserve[cluster]'")

from kvserve.cli.cluster import app_builder

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kuberay-rayservice.yaml"


def _deployments(app: object) -> dict[str, object]:
    ingress = app._bound_deployment  # type: ignore[attr-defined]
    replica = ingress.init_args[0]._bound_deployment
    return {"ingress": ingress, "replica": replica}


def test_the_rayservice_manifest_builds_the_application() -> None:
    service = next(yaml.safe_load_all(MANIFEST.read_text()))
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    (application,) = config["applications"]
    assert application["import_path"] == "kvserve.cli.cluster:app_builder"
    deployments = _deployments(app_builder(application["args"]))
    replica = deployments["replica"]
    assert replica.num_replicas == 4
    assert replica.ray_actor_options["num_cpus"] == 4
    router = replica._deployment_config.request_router_config
    assert router.request_router_class.endswith("KvserveRequestRouter")
    assert service["spec"]["rayClusterConfig"]["rayVersion"] == "2.60.0"


def test_rays_default_router_for_comparison() -> None:
    replica = _deployments(app_builder({"flags": "--router ray --replicas 3"}))["replica"]
    assert replica._deployment_config.request_router_config.is_default_request_router()
    assert replica.num_replicas == 3
