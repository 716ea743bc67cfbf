"""Shared API tests for team-scoped models (the NetBox way): a test class for a model sets the endpoint
and how to make a valid payload, and inherits CRUD + team-scoping + bad-input tests."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient


class TeamScopedApiTests:
    endpoint: str = ""  # e.g. "/api/clusters/"

    def valid_payload(self, n: int) -> dict:
        raise NotImplementedError

    def invalid_payloads(self) -> list[tuple[dict, str]]:
        """(payload, field that the 400 must name)"""
        raise NotImplementedError

    def update_payload(self) -> dict:
        raise NotImplementedError

    @pytest.fixture
    def alice(self, db, make_member):
        return make_member("alice", "Team A")

    @pytest.fixture
    def bob(self, db, make_member):
        return make_member("bob", "Team B")

    def client_for(self, user) -> APIClient:
        c = APIClient()
        c.force_authenticate(user)
        return c

    def create(self, user, n: int = 1) -> dict:
        r = self.client_for(user).post(self.endpoint, self.valid_payload(n), format="json")
        assert r.status_code == 201, r.content
        return r.json()

    def test_anonymous_is_refused(self, db):
        r = APIClient().get(self.endpoint)
        assert r.status_code in (401, 403)

    def test_create_list_retrieve_update_delete(self, alice):
        obj = self.create(alice)
        c = self.client_for(alice)
        assert obj["team"] == "team-a"
        listed = c.get(self.endpoint).json()["results"]
        assert [o["id"] for o in listed] == [obj["id"]]
        assert c.get(f"{self.endpoint}{obj['id']}/").json()["id"] == obj["id"]
        r = c.patch(f"{self.endpoint}{obj['id']}/", self.update_payload(), format="json")
        assert r.status_code == 200, r.content
        for key, value in self.update_payload().items():
            assert r.json()[key] == value
        assert c.delete(f"{self.endpoint}{obj['id']}/").status_code == 204
        assert c.get(f"{self.endpoint}{obj['id']}/").status_code == 404

    def test_other_teams_objects_are_invisible(self, alice, bob):
        theirs = self.create(bob)
        c = self.client_for(alice)
        assert c.get(self.endpoint).json()["results"] == []
        url = f"{self.endpoint}{theirs['id']}/"
        assert c.get(url).status_code == 404
        assert c.patch(url, self.update_payload(), format="json").status_code == 404
        assert c.delete(url).status_code == 404
        assert self.client_for(bob).get(url).status_code == 200

    def test_cannot_create_in_another_team(self, alice, bob):
        payload = {**self.valid_payload(1), "team": "team-b"}
        r = self.client_for(alice).post(self.endpoint, payload, format="json")
        assert r.status_code == 400
        assert "team" in r.json()

    def test_invalid_payloads_name_the_field(self, alice):
        c = self.client_for(alice)
        for payload, field_name in self.invalid_payloads():
            r = c.post(self.endpoint, payload, format="json")
            assert r.status_code == 400, (payload, r.content)
            named = [k for k in r.json() if k == field_name or k.startswith(field_name + ".")]
            assert named, (field_name, r.json())

    def test_malformed_json_is_a_400(self, alice):
        r = self.client_for(alice).post(self.endpoint, data="{not json", content_type="application/json")
        assert r.status_code == 400
        assert "JSON parse error" in r.json()["detail"]
