"""Serializers for rows that store one contract document (cluster.json, model.json, …) in ``spec``.

The API reads and writes the document itself (import/export round-trips unchanged, in JSON or YAML),
with ``id``, ``team`` and timestamps added; validation is the engine's own (one source of truth)."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.common.api import TeamOwnedSerializer

META_FIELDS = {"id", "team", "created_at", "updated_at"}


class DocumentSerializer(TeamOwnedSerializer):
    """Subclasses set ``Meta.model`` and implement ``validate_document(doc) -> dict of extra row fields``."""

    class Meta:
        fields = ["id", "team", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_document(self, document: dict) -> dict:
        raise NotImplementedError

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Send the document as a JSON (or YAML) object."]}
            )
        attrs = super().to_internal_value({k: v for k, v in data.items() if k == "team"})
        document = {k: v for k, v in data.items() if k not in META_FIELDS}
        if self.partial and self.instance is not None:
            document = {**self.instance.spec, **document}
        attrs.update(self.validate_document(document))
        attrs["spec"] = document
        attrs.setdefault("name", document.get("name", ""))
        return attrs

    def validate(self, attrs):
        attrs = super().validate(attrs)
        team = attrs.get("team") or self.instance.team
        model = self.Meta.model
        clash = model.objects.filter(team=team, name=attrs["name"])
        if self.instance is not None:
            clash = clash.exclude(pk=self.instance.pk)
        if clash.exists():
            raise serializers.ValidationError(
                {"name": [f"Your team already has a {model._meta.verbose_name} named {attrs['name']!r}."]}
            )
        return attrs

    def to_representation(self, instance):
        return {**instance.spec, **super().to_representation(instance)}
