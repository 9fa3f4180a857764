"""TensorFlow's gRPC servers bound to 127.0.0.1 on a local cluster.

TensorFlow's servers bind every interface ("0.0.0.0:<port>" hard-coded, no bind address), so the
local launcher preloads a 30-line library (`LOOPBACK_BIND_SOURCE`, built once with the C
compiler) that turns a wildcard `bind` into one on 127.0.0.1 (IPv6: ::ffff:127.0.0.1, which a
dual-stack socket accepts); without a compiler it refuses on a host with a non-loopback address
unless `cluster.allow_external_interfaces=true`.
"""

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from bwopt.cluster import ClusterError

LOOPBACK_BIND_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

/* bwopt: a bind() to the wildcard address binds to loopback instead (TensorFlow's gRPC servers
   hard-code 0.0.0.0). IPv6 wildcards become ::ffff:127.0.0.1, which a dual-stack socket accepts. */
int bind(int fd, const struct sockaddr *address, socklen_t length) {
  static int (*real_bind)(int, const struct sockaddr *, socklen_t);
  if (!real_bind) real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
  if (address && address->sa_family == AF_INET && length >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in copy;
    memcpy(&copy, address, sizeof copy);
    if (copy.sin_addr.s_addr == htonl(INADDR_ANY)) {
      copy.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
    }
  }
  if (address && address->sa_family == AF_INET6 && length >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 copy;
    memcpy(&copy, address, sizeof copy);
    if (IN6_IS_ADDR_UNSPECIFIED(&copy.sin6_addr)) {
      memset(&copy.sin6_addr, 0, sizeof copy.sin6_addr);
      copy.sin6_addr.s6_addr[10] = 0xff;
      copy.sin6_addr.s6_addr[11] = 0xff;
      copy.sin6_addr.s6_addr[12] = 127;
      copy.sin6_addr.s6_addr[15] = 1;
      return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
    }
  }
  return real_bind(fd, address, length);
}
"""


def loopback_preload(allow_external_interfaces: bool) -> Optional[str]:
    """Path of the loopback-bind library, built on first use; None where no compiler is found
    and the host (or its network namespace) has only loopback addresses, or external interfaces
    are allowed.

    Raises:
        ClusterError: no compiler, a non-loopback address, and external interfaces not allowed.
    """
    digest = hashlib.sha256(LOOPBACK_BIND_SOURCE.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bwopt"
    library = cache / f"loopback_bind-{digest}.so"
    if library.exists():
        return str(library)
    error = _build_library(LOOPBACK_BIND_SOURCE, library)
    if error is None:
        return str(library)
    from bwopt.data.service import non_loopback_addresses

    external = non_loopback_addresses()
    if external and not allow_external_interfaces:
        raise ClusterError(
            f"cluster=local: TensorFlow's servers would listen on every interface ({', '.join(external)}) "
            f"and the loopback-bind library could not be built ({error}); install a C compiler (cc), "
            "run inside a loopback-only network namespace, or set cluster.allow_external_interfaces=true"
        )
    return None


def _build_library(source: str, library: Path) -> Optional[str]:
    """Compile `source` into `library` (atomically); the error text, or None when built."""
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as folder:
        source_path, built = Path(folder) / "library.c", Path(folder) / "library.so"
        source_path.write_text(source)
        compiler = os.environ.get("CC", "cc")
        try:
            result = subprocess.run(
                [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(source_path), "-ldl"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{compiler}: {error}"
        if result.returncode != 0:
            return f"{compiler} failed: {result.stderr.strip()[:500]}"
        os.replace(built, library)
    return None
