"""Short-lived Voyager service tokens that the spawner mints itself.

The hub holds a private key (EC P-256 for ES256, or RSA for RS256); Voyager
holds only the public half (VOYAGER_JWT_PUBLIC_KEYS). Every token the
spawner sends lives `lifetime` seconds and is replaced once half of that
has passed, so no token outlives a few minutes and none has to be
renewed by hand. Signing uses `cryptography`, which JupyterHub already
depends on (through certipy and pyOpenSSL).
"""

import base64
import json
import os
import threading
import time
import uuid

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature


# The claim in which the hub signs the user a token acts for, and her
# groups (api.OnBehalfOfClaim in Voyager).
ON_BEHALF_OF_CLAIM = "voyager_on_behalf_of"


def _b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class SigningKeyError(ValueError):
    """A private key file that cannot sign Voyager tokens."""


def load_private_key(path):
    """Reads a PEM private key and returns (key, alg): ES256 for an EC P-256
    key, RS256 for an RSA key of 2048 bits or more."""
    try:
        with open(path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    except OSError as e:
        raise SigningKeyError(f"read Voyager signing key {path}: {e}") from None
    except (ValueError, TypeError) as e:
        raise SigningKeyError(f"read Voyager signing key {path}: {e}: want an unencrypted PEM private key "
                        "(EC P-256 or RSA; `python3 -m voyager_spawner keygen` writes one)") from None
    if isinstance(key, ec.EllipticCurvePrivateKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise SigningKeyError(f"Voyager signing key {path}: curve {key.curve.name}: want P-256 (ES256)")
        return key, "ES256"
    if isinstance(key, rsa.RSAPrivateKey):
        if key.key_size < 2048:
            raise SigningKeyError(f"Voyager signing key {path}: RSA key of {key.key_size} bits: want 2048 or more")
        return key, "RS256"
    raise SigningKeyError(f"Voyager signing key {path}: {type(key).__name__}: want an EC P-256 or RSA private key")


def sign(key, alg, claims, kid=""):
    """A compact JWS of claims signed with key (ES256 or RS256)."""
    header = {"alg": alg, "typ": "JWT"}
    if kid:
        header["kid"] = kid
    signing_input = (_b64(json.dumps(header, separators=(",", ":")).encode()) + "." +
                     _b64(json.dumps(claims, separators=(",", ":")).encode())).encode("ascii")
    if alg == "ES256":
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    else:
        sig = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return signing_input.decode("ascii") + "." + _b64(sig)


class Minter:
    """Mints and caches service tokens from a private key file.

    token() returns the cached token while more than half of its lifetime
    is left, else a fresh one. The key file is read again when it changes
    (key rotation needs no hub restart). Safe to share between spawners.
    """

    def __init__(self, key_file, subject, roles, lifetime, audience="", issuer="", kid="",
                 roles_claim="roles", clock=time.time):
        if lifetime < 10:
            raise ValueError(f"Voyager token lifetime {lifetime}s: want 10 seconds or more")
        self.key_file, self.subject, self.roles = key_file, subject, list(roles)
        self.lifetime, self.audience, self.issuer, self.kid = lifetime, audience, issuer, kid
        self.roles_claim = roles_claim
        self.clock = clock
        self._lock = threading.Lock()
        self._key = self._alg = None
        self._key_stamp = None
        # By (user, groups): (token, renew at, expires at). The service's
        # own token is under (None, ()).
        self._cache = {}
        self._exp = 0.0
        self.minted = 0  # how many tokens this minter has made

    def _load(self):
        st = os.stat(self.key_file)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._key_stamp:
            self._key, self._alg = load_private_key(self.key_file)
            self._key_stamp = stamp
            self._cache.clear()  # a new key: new tokens
        return self._key, self._alg

    def token(self, user=None, groups=()):
        """A token valid for at least half the lifetime. With user, it also
        signs the user it acts for and her groups (claim
        voyager_on_behalf_of), so Voyager gives her those groups: a header
        alone is not signed."""
        with self._lock:
            try:
                key, alg = self._load()
            except OSError as e:
                raise SigningKeyError(f"read Voyager signing key {self.key_file}: {e}") from None
            now = self.clock()
            ck = (user, tuple(groups or ()))
            cached = self._cache.get(ck)
            if cached and now < cached[1]:
                self._exp = cached[2]
                return cached[0]
            iat = int(now)
            claims = {"sub": self.subject, "iat": iat, "nbf": iat - 5, "exp": iat + int(self.lifetime),
                      "jti": uuid.uuid4().hex}
            claims.update(_nested(self.roles_claim, self.roles))
            if user is not None:
                claims[ON_BEHALF_OF_CLAIM] = {"sub": user, "groups": list(ck[1])}
            if self.audience:
                claims["aud"] = self.audience
            if self.issuer:
                claims["iss"] = self.issuer
            tok = sign(key, alg, claims, self.kid)
            if len(self._cache) > 4096:  # users come and go: forget the expired
                self._cache = {k: v for k, v in self._cache.items() if v[2] > now}
            self._cache[ck] = (tok, iat + self.lifetime / 2, iat + self.lifetime)
            self._exp = iat + self.lifetime
            self.minted += 1
            return tok

    def expires(self):
        """When the token last returned expires (seconds since the epoch)."""
        return self._exp


def _nested(path, value):
    """{"a": {"b": value}} for path "a.b": Voyager walks dots into objects."""
    out = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


_minters = {}
_minters_lock = threading.Lock()


def shared_minter(key_file, subject, roles, lifetime, audience="", issuer="", kid="", roles_claim="roles"):
    """One Minter per distinct configuration, shared by every spawner of the
    hub, so that a hundred users' spawners do not sign a hundred tokens."""
    k = (os.path.abspath(key_file), subject, tuple(roles), lifetime, audience, issuer, kid, roles_claim)
    with _minters_lock:
        m = _minters.get(k)
        if m is None:
            m = _minters[k] = Minter(key_file, subject, roles, lifetime, audience, issuer, kid, roles_claim)
        return m


def keygen(prefix, kind="ec"):
    """Writes prefix.key (private, mode 0600) and prefix.pub (public, for
    VOYAGER_JWT_PUBLIC_KEYS), making prefix's directory (mode 0700) if it
    does not exist; refuses to overwrite a key."""
    if kind == "ec":
        key = ec.generate_private_key(ec.SECP256R1())
    elif kind == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    else:
        raise ValueError(f"key kind {kind!r}: want ec or rsa")
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    parent = os.path.dirname(prefix)
    if parent:
        # keygen /etc/jupyterhub/voyager/hub on a fresh hub: the directory
        # holds a private key, so it is made for its owner alone.
        os.makedirs(parent, mode=0o700, exist_ok=True)
    fd = os.open(prefix + ".key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(priv)
    with open(prefix + ".pub", "wb") as f:
        f.write(pub)
    return prefix + ".key", prefix + ".pub"
