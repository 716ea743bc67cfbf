from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.models import ApiToken
from controlplane.accounts.services import token_issue, token_revoke


class Command(BaseCommand):
    help = "Create, list or revoke API tokens: api_token create USER --name N | list USER | revoke PREFIX"

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="issue a token and print it once")
        create.add_argument("username")
        create.add_argument("--name", required=True, help="what the token is for")
        listing = sub.add_parser("list", help="list a user's tokens")
        listing.add_argument("username")
        revoke = sub.add_parser("revoke", help="revoke a token by its prefix (ct_<prefix>_…)")
        revoke.add_argument("prefix")

    def _user(self, username):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        return user

    def handle(self, *args, **opts):
        if opts["action"] == "create":
            _token, raw = token_issue(user=self._user(opts["username"]), name=opts["name"])
            self.stdout.write(raw)
        elif opts["action"] == "list":
            for t in ApiToken.objects.filter(user=self._user(opts["username"])):
                state = "revoked" if t.revoked_at else "active"
                self.stdout.write(f"{t.prefix}\t{t.name}\t{state}\tcreated {t.created_at:%Y-%m-%d %H:%M}")
        else:
            prefix = opts["prefix"].removeprefix("ct_").split("_")[0]
            token = ApiToken.objects.filter(prefix=prefix).first()
            if token is None:
                raise CommandError(f"No token with prefix {prefix!r}.")
            token_revoke(token=token)
            self.stdout.write(f"revoked {token.prefix} ({token.name})")
