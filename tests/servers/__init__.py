"""Real ZooKeeper and etcd servers for the test session, and the fault tools around them
(a severable TCP proxy, throw-away TLS certificates, free ports).

Invariant: every process started here runs from a temporary directory and is stopped at
the end of the session, even when the session fails.
"""

from tests.servers.env import ETCD_ENV, ZK_ENV, parse_hosts
from tests.servers.etcd import EtcdCluster, EtcdServer
from tests.servers.external import ExternalServer
from tests.servers.ports import free_port
from tests.servers.process import ServerStartError
from tests.servers.proxy import TCPProxy
from tests.servers.tls import TLSFiles, make_tls_files
from tests.servers.zookeeper import ZooKeeperEnsemble, ZooKeeperServer

__all__ = [
    "ETCD_ENV",
    "ZK_ENV",
    "EtcdCluster",
    "EtcdServer",
    "ExternalServer",
    "ServerStartError",
    "TCPProxy",
    "TLSFiles",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "free_port",
    "make_tls_files",
    "parse_hosts",
]
