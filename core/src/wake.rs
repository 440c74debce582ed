//! Wake-on-LAN (issue 16): a node reports its network interfaces' MAC addresses in its
//! capabilities; `shoal node wake ID` has the members send the magic packet for them. Pure:
//! MAC parsing and the packet's bytes; the shell broadcasts it.

/// Most MAC addresses a node may report.
pub const MACS_MAX: usize = 16;
/// The UDP port magic packets are broadcast to (the discard port, as most tools do).
pub const WAKE_PORT: u16 = 9;

/// `aa:bb:cc:dd:ee:ff` (or with `-`), any case → its six bytes; `None` for anything else, and
/// for the all-zero and broadcast addresses (no interface has them).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 || s.len() != 17 {
        return None;
    }
    let mut out = [0u8; 6];
    for (o, p) in out.iter_mut().zip(&parts) {
        if p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *o = u8::from_str_radix(p, 16).ok()?;
    }
    if out == [0; 6] || out == [0xff; 6] {
        return None;
    }
    Some(out)
}

/// A MAC address written the one way records carry it: lower case, `:`-separated.
pub fn canonical_mac(s: &str) -> Option<String> {
    parse_mac(s).map(|m| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"))
}

/// The magic packet: six 0xFF bytes, then the MAC sixteen times.
pub fn magic_packet(mac: &[u8; 6]) -> [u8; 102] {
    let mut p = [0xffu8; 102];
    for chunk in p[6..].chunks_mut(6) {
        chunk.copy_from_slice(mac);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_in_either_spelling_and_nothing_else() {
        assert_eq!(parse_mac("AA:bb:0c:dd:ee:01"), Some([0xaa, 0xbb, 0x0c, 0xdd, 0xee, 0x01]));
        assert_eq!(parse_mac("aa-bb-0c-dd-ee-01"), Some([0xaa, 0xbb, 0x0c, 0xdd, 0xee, 0x01]));
        assert_eq!(canonical_mac("AA-BB-0C-DD-EE-01").as_deref(), Some("aa:bb:0c:dd:ee:01"));
        for bad in [
            "",
            "aa:bb:cc:dd:ee",
            "aa:bb:cc:dd:ee:ff:00",
            "aa:bb:cc:dd:ee:fg",
            "aabb.ccdd.eeff",
            "a:bb:cc:dd:ee:fff",
            "00:00:00:00:00:00",
            "ff:ff:ff:ff:ff:ff",
            "+a:bb:cc:dd:ee:ff",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_magic_packet_is_six_ff_then_the_mac_sixteen_times() {
        let mac = [1, 2, 3, 4, 5, 6];
        let p = magic_packet(&mac);
        assert_eq!(&p[..6], &[0xff; 6]);
        for i in 0..16 {
            assert_eq!(&p[6 + i * 6..12 + i * 6], &mac);
        }
    }
}
