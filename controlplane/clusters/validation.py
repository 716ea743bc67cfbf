"""Validation of the cluster.json document at the API edge (field-level messages)."""

from __future__ import annotations

from rest_framework import serializers


class _Device(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    peak_tflops = serializers.DictField(child=serializers.FloatField(min_value=0.001), allow_empty=False)
    memory_GiB = serializers.FloatField(min_value=0.001)
    memory_bandwidth_GBps = serializers.FloatField(min_value=0.001, required=False)
    tdp_watts = serializers.FloatField(min_value=1, required=False)


class _Link(serializers.Serializer):
    kind = serializers.CharField(max_length=100)
    bandwidth_GBps = serializers.FloatField(min_value=0.000001)
    latency_us = serializers.FloatField(min_value=0)


class _Tier(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    nodes = serializers.IntegerField(min_value=1)
    oversubscription = serializers.FloatField(min_value=1.0)


class ClusterDocument(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    num_nodes = serializers.IntegerField(min_value=1)
    devices_per_node = serializers.IntegerField(min_value=1)
    device = _Device()
    intra_node = _Link()
    inter_node = _Link()
    tiers = _Tier(many=True, required=False)


def validate_cluster_document(document: dict) -> dict:
    """The document with field-level errors raised as a DRF ValidationError; unknown keys are kept."""
    checked = ClusterDocument(data=document)
    checked.is_valid(raise_exception=True)
    return document
