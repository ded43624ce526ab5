"""What a testbed is made of, by name: namespaces, interfaces, addresses, files, rates.

Every object carries the prefix `asgd-<name>` (`asgc-<name>` on the control network),
so `down` can find what `up` made (even after a killed `up`) and never touches anything
else. Two networks: the data network, whose shaped links carry only what the ranks send
each other (the byte proof counts it), and the control network, unshaped, for the MPI
launcher's traffic (starting the ranks, PMI, forwarded output), which is not the job's:
  data bridge       asgd-<name>                (root namespace, no address)
  control bridge    asgc-<name>                (root namespace, address <control>.1/24: the launcher's)
  host k            network namespace asgd-<name>-h<k>, hostname asgd-<name>-h<k>,
                    address <subnet>.<10+k>/24 on its eth0 (MAC host_mac(k)),
                    <control>.<10+k>/24 on its ctl
  links of host k   veth asgd-<name>-<k> (root side, in the data bridge) <-> eth0 (in the host)
                    veth asgc-<name>-<k> (in the control bridge) <-> ctl (in the host)
  state             /run/asgd-testbed/<name>/ (state.json, the ssh stand-in, namespace files)
Interface names are at most 15 characters, hence a testbed name of at most 6.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

PREFIX = "asgd-"
CONTROL_PREFIX = "asgc-"
NAME_RE = re.compile(r"^[a-z0-9]{1,6}$")
MAX_HOSTS = 200                      # addresses .10 .. .209 of the /24
FIRST_HOST_OCTET = 10
STATE_ROOT = Path(os.environ.get("ASGD_TESTBED_STATE", "/run/asgd-testbed"))

# tc's bit-rate suffixes, matched case-insensitively as tc does (iproute2's get_rate,
# lib/utils_math.c; the same table in tc_util.c before 5.11). tc also takes byte rates
# (bps, kbps, mbps, ..., kibps, ...: 12mbps is 12 MEGABYTES/s) and reads a bare number as
# bits/s (its older man page said bytes/s): both are refused here, as is anything tc
# itself would refuse, such as 100Mb/s (megabits to most people; this parser once read
# it as megabytes).
BIT_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
             "kibit": 2.0**10, "mibit": 2.0**20, "gibit": 2.0**30, "tibit": 2.0**40}
MIN_RATE_BIT = 8000
_SPELLING = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z/]*)\s*")
_NOT_TCS = re.compile(r"(?i:(k|m|g|t|ki|mi|gi|ti)?)((?i:bps)|B/s|b/s|(?i:bit/s))")
_PREFIX_WORD = {"": "", "k": "kilo", "m": "mega", "g": "giga", "t": "tera",
                "ki": "kibi", "mi": "mebi", "gi": "gibi", "ti": "tebi"}


def _refusal(text: str, number: float, unit: str) -> str:
    """Why `text` is not taken, what it would mean, and what to write instead."""
    if unit == "":
        return (f"rate {text!r} has no unit: tc reads a bare number as bits/s ({format_rate(number)}; its older "
                f"man page said bytes/s, {format_rate(8 * number)}): write the unit, e.g. {format_rate(number)}")
    m = _NOT_TCS.fullmatch(unit)
    if m:
        p = (m.group(1) or "").lower()
        bits, bytes_ = f"{number:g}{p}bit", f"{8 * number:g}{p}bit"
        word = f"{_PREFIX_WORD[p]}bytes/s"
        if m.group(2).lower() == "bps":
            return (f"rate {text!r} is {word} to tc ({bytes_}), {_PREFIX_WORD[p]}bits/s to many readers: write "
                    f"{bytes_} for {word} or {bits} for {_PREFIX_WORD[p]}bits/s")
        if m.group(2) == "B/s":
            return f"rate {text!r} is {word}: write {bytes_} (tc's spelling, in bits/s)"
        if m.group(2).lower() == "bit/s":
            return f"rate {text!r}: write {bits} (tc's spelling, without /s)"
        return (f"rate {text!r} is ambiguous ({_PREFIX_WORD[p]}bits/s to most people, {word} to some): write "
                f"{bits} for {_PREFIX_WORD[p]}bits/s or {bytes_} for {word}")
    return (f"bad rate {text!r}: a number and one of tc's bit-rate units {', '.join(BIT_UNITS)} "
            "(any case), e.g. 100mbit")


def parse_rate(text: str) -> int:
    """Bits per second from tc's bit-rate spellings: '100mbit', '1Gbit', '500kbit',
    '10mibit'. Byte rates ('12mbps', '100MB/s'), '100Mb/s' and bare numbers raise
    ValueError with one line saying what they would mean and what to write instead."""
    m = _SPELLING.fullmatch(text)
    if not m:
        raise ValueError(_refusal(text, 0.0, "?"))
    number, unit = float(m.group(1)), m.group(2)
    scale = BIT_UNITS.get(unit.lower())
    if scale is None:
        raise ValueError(_refusal(text, number, unit))
    bits = number * scale
    if bits < MIN_RATE_BIT:
        raise ValueError(f"rate {text!r} is below {format_rate(MIN_RATE_BIT)} (1 KB/s)")
    return int(bits)


def format_rate(bits: float) -> str:
    for unit, f in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= f:
            return f"{bits / f:g}{unit}"
    return f"{bits:g}bit"


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ValueError(f"bad testbed name {name!r}: 1-6 lowercase letters or digits "
                         "(interface names are at most 15 characters)")
    return name


@dataclass(frozen=True)
class Spec:
    name: str
    hosts: int
    rate_bit: int          # each link, each direction, bits/s
    latency_us: float = 0.0  # one-way host-to-host latency asked for (netem), microseconds
    subnet: str = "10.231.0"  # first three octets of the data network's /24
    control: str = "10.232.0"  # first three octets of the control network's /24

    def __post_init__(self):
        check_name(self.name)
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise ValueError(f"--hosts must be 1..{MAX_HOSTS}, not {self.hosts}")
        if self.latency_us < 0:
            raise ValueError("--latency must be >= 0")

    # -- names -----------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.name}"

    def host(self, k: int) -> str:
        """Host k's name: its network namespace and its hostname."""
        return f"{PREFIX}{self.name}-h{k}"

    def veth(self, k: int) -> str:
        """The root-namespace end of host k's data link (the host's end is its eth0)."""
        return f"{PREFIX}{self.name}-{k}"

    @property
    def control_bridge(self) -> str:
        return f"{CONTROL_PREFIX}{self.name}"

    def control_veth(self, k: int) -> str:
        """The root-namespace end of host k's control link (the host's end is its ctl)."""
        return f"{CONTROL_PREFIX}{self.name}-{k}"

    @property
    def host_names(self) -> list[str]:
        return [self.host(k) for k in range(self.hosts)]

    def index(self, host: str) -> int:
        m = re.fullmatch(re.escape(f"{PREFIX}{self.name}-h") + r"(\d+)", host)
        if not m or int(m.group(1)) >= self.hosts:
            raise KeyError(f"{host} is not a host of testbed {self.name}")
        return int(m.group(1))

    # -- addresses -----------------------------------------------------------------------
    def host_ip(self, k: int) -> str:
        """Host k's address on the data network."""
        return f"{self.subnet}.{FIRST_HOST_OCTET + k}"

    @staticmethod
    def host_mac(k: int) -> str:
        """Host k's eth0 (locally administered, fixed: every host's neighbour table lists
        every other host's before any exists, so no ARP crosses the data links)."""
        return f"02:61:73:67:{k >> 8:02x}:{k & 255:02x}"

    @property
    def cidr(self) -> str:
        return f"{self.subnet}.0/24"

    @property
    def launcher_ip(self) -> str:
        """The root namespace's address on the control network: the MPI launcher's."""
        return f"{self.control}.1"

    def control_ip(self, k: int) -> str:
        return f"{self.control}.{FIRST_HOST_OCTET + k}"

    @property
    def control_cidr(self) -> str:
        return f"{self.control}.0/24"

    # -- files -------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return STATE_ROOT / self.name

    def ns_file(self, k: int, kind: str) -> Path:
        """Host k's persistent namespace of `kind` (uts, ipc): a bind-mounted nsfs file."""
        return self.dir / f"{self.host(k)}.{kind}"

    @property
    def rsh(self) -> Path:
        """The ssh stand-in: `rsh HOST COMMAND...` runs COMMAND inside HOST's namespaces."""
        return self.dir / "rsh"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Spec:
        return cls(**{k: d[k] for k in ("name", "hosts", "rate_bit", "latency_us", "subnet", "control") if k in d})


def link_names(name: str, links: list[str]) -> list[str]:
    """The interfaces among `links` that belong to testbed `name` (both bridges and the
    root-side veths of both networks)."""
    pat = re.compile(f"({re.escape(PREFIX)}|{re.escape(CONTROL_PREFIX)})" + re.escape(name) + r"(-\d+)?")
    return [x for x in links if pat.fullmatch(x)]


def is_bridge_name(name: str, dev: str) -> bool:
    return dev in (f"{PREFIX}{name}", f"{CONTROL_PREFIX}{name}")


def netns_names(name: str, namespaces: list[str]) -> list[str]:
    pat = re.compile(re.escape(f"{PREFIX}{name}-h") + r"\d+")
    return [x for x in namespaces if pat.fullmatch(x)]
