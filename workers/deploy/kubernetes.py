"""Launch a rendered job (:func:`workers.deploy.render.render_kubernetes`: a ``ConfigMap`` and a Kubeflow
Training Operator ``PyTorchJob``) through the Kubernetes API with the official ``kubernetes`` client, and
follow it: the PyTorchJob's status conditions say its state, deleting it (and its ConfigMap) cancels it,
and the log is the first worker pod's.

The cluster comes from ``KUBECONFIG`` (or ``~/.kube/config``), else from the pod's service account when the
control plane runs in the cluster (:func:`api_client`).

States: the training operator sets conditions of type ``Created``, ``Running``, ``Restarting``,
``Succeeded``, ``Failed`` (and ``Suspended``) on ``status.conditions`` (``kubeflow.org/v1`` ``JobCondition``,
training-operator ``pkg/apis/kubeflow.org/v1/common_types.go``), each with ``status`` "True"/"False",
``reason`` (``PyTorchJobFailed`` ...) and ``message``; a finished job keeps ``Running`` at "False" beside its
``Succeeded``/``Failed`` at "True". :func:`pytorchjob_state` maps them into the launchers' vocabulary
(:mod:`workers.deploy.launchers`); a PyTorchJob the API server no longer has (deleted) is gone.
"""

from __future__ import annotations

from typing import Any

from workers.deploy.launchers import (
    FAILED,
    GONE,
    LAUNCHING,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    ExternalState,
    SchedulerError,
)

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
REQUEST_TIMEOUT_S = 30.0
"""How long one API request may take (the client's default is none: a hung API server would hang the
relay's loop)."""
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
"""The labels the training operator puts on a job's pods (its ``JobNameLabel`` / ``ReplicaIndexLabel``)."""


def pytorchjob_state(doc: dict[str, Any]) -> ExternalState:
    """A PyTorchJob object (as ``GET .../pytorchjobs/<name>`` returns it) in the launchers' vocabulary: the
    terminal conditions first (Succeeded, Failed), then Suspended (queued), Restarting / Running (running),
    Created (launching: pods being created); no condition yet -> queued (the operator has not seen it)."""
    conditions = {
        c.get("type"): c for c in ((doc.get("status") or {}).get("conditions") or []) if isinstance(c, dict)
    }

    def true(kind: str) -> dict | None:
        c = conditions.get(kind)
        return c if c is not None and str(c.get("status")) == "True" else None

    order = (
        ("Succeeded", SUCCEEDED),
        ("Failed", FAILED),
        ("Suspended", QUEUED),
        ("Restarting", RUNNING),
        ("Running", RUNNING),
        ("Created", LAUNCHING),
    )
    for kind, state in order:
        if c := true(kind):
            message = str(c.get("message") or "")
            return ExternalState(
                state=state,
                detail=f"{kind}" + (f": {message}" if message else ""),
                reason=message or str(c.get("reason") or ""),
                exit_code={SUCCEEDED: 0, FAILED: 1}.get(state),
            )
    return ExternalState(QUEUED, "no status yet (the training operator has not picked it up)")


def api_client():
    """A client for the configured cluster: ``KUBECONFIG`` / ``~/.kube/config``, else in-cluster."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as kube_error:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            raise SchedulerError(
                f"no Kubernetes cluster configured: set KUBECONFIG to a kubeconfig file, or run the control plane "
                f"in the cluster with a service account ({kube_error})"
            ) from None
    return client.ApiClient(configuration)


class PyTorchJobs:
    """The PyTorchJobs (and their ConfigMaps) of one namespace."""

    def __init__(self, namespace: str, client=None):
        from kubernetes import client as k8s

        self.namespace = namespace
        self._client = client if client is not None else api_client()
        self.core = k8s.CoreV1Api(self._client)
        self.custom = k8s.CustomObjectsApi(self._client)

    def _call(self, what: str, fn, *args, missing_ok: bool = False, **kwargs):
        from kubernetes.client import ApiException

        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                return None
            raise SchedulerError(
                f"Kubernetes API: {what}: {exc.status} {exc.reason}: {exc.body or ''}"
            ) from None
        except Exception as exc:  # noqa: BLE001 - urllib3's connection errors, a bad certificate ...
            raise SchedulerError(f"Kubernetes API: {what}: {exc}") from None

    def submit(self, objects: list[dict]) -> str:
        """Create ``[ConfigMap, PyTorchJob]`` (``render_kubernetes``'s, in its order: the pods mount the
        ConfigMap). Returns the PyTorchJob's name."""
        by_kind = {o["kind"]: o for o in objects}
        config_map, job = by_kind["ConfigMap"], by_kind["PyTorchJob"]
        self._call(
            f"create ConfigMap {config_map['metadata']['name']}",
            self.core.create_namespaced_config_map,
            self.namespace,
            config_map,
        )
        name = job["metadata"]["name"]
        self._call(
            f"create PyTorchJob {name} (is the Kubeflow Training Operator installed?)",
            self.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            job,
        )
        return name

    def state(self, name: str) -> ExternalState:
        doc = self._call(
            f"read PyTorchJob {name}",
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
            missing_ok=True,
        )
        if doc is None:
            return ExternalState(GONE, f"PyTorchJob {self.namespace}/{name} no longer exists (deleted)")
        return pytorchjob_state(doc)

    def cancel(self, name: str, config_map: str | None = None) -> None:
        """Delete the PyTorchJob (its pods go with it: background propagation) and its ConfigMap; what is
        already gone is fine."""
        self._call(
            f"delete PyTorchJob {name}",
            self.custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
            propagation_policy="Background",
            missing_ok=True,
        )
        self._call(
            f"delete ConfigMap {config_map or name + '-config'}",
            self.core.delete_namespaced_config_map,
            config_map or f"{name}-config",
            self.namespace,
            missing_ok=True,
        )

    def log_tail(self, name: str, lines: int = 200) -> str:
        """The last ``lines`` of the first worker pod's log ("" when it has no pod, e.g. deleted)."""
        pods = self._call(
            f"list the pods of {name}",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{JOB_NAME_LABEL}={name},{REPLICA_INDEX_LABEL}=0",
        )
        items = getattr(pods, "items", None) or []
        if not items:
            return ""
        text = self._call(
            f"read the log of {items[0].metadata.name}",
            self.core.read_namespaced_pod_log,
            items[0].metadata.name,
            self.namespace,
            tail_lines=lines,
            missing_ok=True,
        )
        return text or ""
