"""The fields of a worker pod and a TPU node that the operator reads, as typed documents
(and of the objects of a metadata-only list: ``ListedMetadata``).

Pod events are the operator's most frequent input: about five per pod while a job
starts, as many again while it restarts. A worker pod is 6-8 KB of JSON, nearly all of
it spec (containers, env, volumes) and managed fields that no view reads. Decoding the
whole object into dicts and then picking a few fields out cost about 40 us an event;
``msgspec`` decodes the JSON straight into these structs, skipping every field they do
not name without building it, in about a quarter of that (bench/HISTORY.md, entry
06f9091). It also leaves far fewer objects for the
garbage collector.

The types follow the Kubernetes OpenAPI schema of Pod and Node, which the apiserver
enforces for every object it serves; every field is optional, as the apiserver omits
empty ones. ``state/views.py`` builds the cached views from these documents only.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec


class _Doc(msgspec.Struct, gc=False):
    """A decoded part of an object. ``gc=False``: the documents hold no cycles, so the
    garbage collector need not track them (most are dropped as soon as a view is built)."""


class OwnerReference(_Doc):
    apiVersion: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class Metadata(_Doc):
    """Field names are the API's (camelCase), so that no renaming is needed."""

    name: str = ""
    namespace: str | None = None
    uid: str = ""
    resourceVersion: str = ""
    creationTimestamp: str | None = None
    deletionTimestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    ownerReferences: list[OwnerReference] | None = None


class Condition(_Doc):
    type: str = ""
    status: str = ""
    reason: str | None = None
    message: str | None = None
    lastTransitionTime: str | None = None


class Terminated(_Doc):
    exitCode: int | None = None
    reason: str | None = None
    finishedAt: str | None = None


class Running(_Doc):
    startedAt: str | None = None


class ContainerState(_Doc):
    running: Running | None = None
    terminated: Terminated | None = None


class ContainerStatus(_Doc):
    name: str = ""
    state: ContainerState | None = None


class PodStatus(_Doc):
    phase: str | None = None
    reason: str | None = None
    podIP: str | None = None
    startTime: str | None = None
    conditions: list[Condition] | None = None
    containerStatuses: list[ContainerStatus] | None = None


class PodSpec(_Doc):
    nodeName: str | None = None
    nodeSelector: dict[str, str] | None = None
    schedulerName: str | None = None


class PodDocument(_Doc):
    metadata: Metadata | None = None
    spec: PodSpec | None = None
    status: PodStatus | None = None


class Taint(_Doc):
    key: str = ""
    timeAdded: str | None = None


class NodeSpec(_Doc):
    unschedulable: bool | None = None
    taints: list[Taint] | None = None


class NodeStatus(_Doc):
    conditions: list[Condition] | None = None
    allocatable: dict[str, str] | None = None


class NodeDocument(_Doc):
    metadata: Metadata | None = None
    spec: NodeSpec | None = None
    status: NodeStatus | None = None


D = TypeVar("D")


class ListMetadata(_Doc):
    resourceVersion: str = ""
    continue_: str | None = msgspec.field(default=None, name="continue")


class ListDocument(_Doc, Generic[D]):
    """One page of a list."""

    items: list[D] | None = None
    metadata: ListMetadata | None = None


class WatchEvent(_Doc, Generic[D]):
    """One line of a watch. An ERROR event's object is a Status, which does not decode as
    a pod or node: the watch reads those lines as plain JSON."""

    type: str = ""
    object: D | None = None


class RawWatchEvent(_Doc):
    """One line of a watch of a kind decoded whole (custom resources): its object is cut
    out as raw JSON, to be decoded alone."""

    type: str = ""
    object: msgspec.Raw = msgspec.Raw(b"null")


class RawListDocument(_Doc):
    """One page of a list of a kind decoded whole: each item as raw JSON."""

    items: list[msgspec.Raw] | None = None
    metadata: ListMetadata | None = None


class ListedMetadata(_Doc):
    """What a metadata-only list (``PartialObjectMetadataList``) is read for: who each
    object is and who owns it. Its managed fields, most of each item (a TPUSlice's are
    1.5 KB of 2.1, some 60 nested objects), are skipped without being built."""

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] | None = None
    ownerReferences: list[dict[str, Any]] | None = None


class ListedObject(_Doc):
    metadata: ListedMetadata | None = None


EMPTY_METADATA = Metadata()


def metadata_of(document: PodDocument | NodeDocument) -> Metadata:
    return document.metadata or EMPTY_METADATA


def to_document(body: object, kind: type[D]) -> D:
    """A document from an object already decoded into dicts (tests, callers that hold a
    whole object)."""
    return msgspec.convert(body, kind, strict=False)
