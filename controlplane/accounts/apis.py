"""API: who am I, my teams, my API tokens."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.models import ApiToken
from controlplane.accounts.selectors import teams_of, tokens_of
from controlplane.accounts.services import token_issue, token_revoke
from workers.planner.specs import name_problem


class TeamOutput(serializers.Serializer):
    name = serializers.CharField()
    slug = serializers.CharField()


class MeApi(APIView):
    class OutputSerializer(serializers.Serializer):
        username = serializers.CharField()
        teams = TeamOutput(many=True)

    @extend_schema(responses=OutputSerializer)
    def get(self, request):
        data = {"username": request.user.username, "teams": teams_of(request.user)}
        return Response(self.OutputSerializer(data).data)


class TokenOutput(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]


def readable_name(value: str) -> None:
    """The planner's rule for a name a person reads (no control or bidirectional-override characters), the one
    ``common.api.NameField`` applies: accounts sits below ``common`` and takes the rule from the engine."""
    if problem := name_problem(value):
        raise serializers.ValidationError(problem)


class TokenListCreateApi(APIView):
    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(
            max_length=100, validators=[readable_name], help_text="what the token is for, e.g. 'laptop CLI'"
        )

    class CreatedSerializer(TokenOutput):
        token = serializers.CharField(help_text="the raw token; shown only once")

        class Meta(TokenOutput.Meta):
            fields = TokenOutput.Meta.fields + ["token"]

    @extend_schema(responses=TokenOutput(many=True))
    def get(self, request):
        return Response(TokenOutput(tokens_of(request.user), many=True).data)

    @extend_schema(request=InputSerializer, responses={201: CreatedSerializer})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, raw = token_issue(user=request.user, name=data.validated_data["name"])
        token.token = raw
        return Response(self.CreatedSerializer(token).data, status=status.HTTP_201_CREATED)


class TokenRevokeApi(APIView):
    @extend_schema(request=None, responses={204: None})
    def delete(self, request, pk: int):
        token_revoke(token=get_object_or_404(tokens_of(request.user), pk=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
