//! A node netns of a kernel test that forwards to a next hop of its own,
//! for the programs that forward past the stack by the FIB.

use isthmus_tests::netns;

/// The next hop's IPv6 address, and the node's, on their link.
const NEXT_HOP6: &str = "fd00:192:0:2::2";
const NODE6: &str = "fd00:192:0:2::1/64";

/// A test's node netns, linked to its next hop's, and both ends' MACs.
pub struct ForwardingNode {
    ns: &'static str,
    next_hop: [u8; 6],
    node: [u8; 6],
}

impl ForwardingNode {
    /// Builds netns `ns`, forwarding both families, with a route to a's
    /// PodCIDR through `next_hop_ns`.
    pub fn new(ns: &'static str, next_hop_ns: &str) -> Self {
        netns::fresh(&[ns, next_hop_ns]);
        netns::link(ns, next_hop_ns);
        let mac = |ns: &str, dev: &str| -> [u8; 6] {
            let text = isthmus_lab::cmd::ip(ns, &["-br", "link", "show", dev]).unwrap();
            let field = text.split_whitespace().nth(2).unwrap();
            let bytes: Vec<u8> = field
                .split(':')
                .map(|b| u8::from_str_radix(b, 16).unwrap())
                .collect();
            bytes.try_into().unwrap()
        };
        let (next_hop, node) = (mac(next_hop_ns, "v1"), mac(ns, "v0"));
        let lladdr = next_hop.map(|b| format!("{b:02x}")).join(":");
        let ip = |args: &[&str]| isthmus_lab::cmd::ip(ns, args).unwrap();
        ip(&["-6", "addr", "add", NODE6, "dev", "v0", "nodad"]);
        for address in ["192.0.2.2", NEXT_HOP6] {
            let neighbour = [
                "neigh",
                "replace",
                address,
                "lladdr",
                &lladdr,
                "dev",
                "v0",
                "nud",
                "permanent",
            ];
            ip(&neighbour);
        }
        isthmus_lab::cmd::sysctl(ns, "net.ipv4.ip_forward", "1").unwrap();
        isthmus_lab::cmd::sysctl(ns, "net.ipv6.conf.all.forwarding", "1").unwrap();
        let this = Self { ns, next_hop, node };
        this.route("10.244.0.0/24");
        this
    }

    /// Routes `to` through the next hop.
    pub fn route(&self, to: &str) {
        isthmus_lab::cmd::ip(
            self.ns,
            &["route", "add", to, "via", "192.0.2.2", "dev", "v0"],
        )
        .unwrap();
    }

    /// Routes the IPv6 `to` through the next hop.
    pub fn route6(&self, to: &str) {
        isthmus_lab::cmd::ip(
            self.ns,
            &["-6", "route", "add", to, "via", NEXT_HOP6, "dev", "v0"],
        )
        .unwrap();
    }

    /// `frame` as this node forwards it to the next hop: the next hop's
    /// MACs in place of its own.
    pub fn to_next_hop(&self, mut frame: Vec<u8>) -> Vec<u8> {
        frame.splice(..12, [self.next_hop, self.node].concat());
        frame
    }
}
