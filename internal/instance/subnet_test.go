package instance

import (
	"net/netip"
	"testing"
)

// TestCheckSubnet: only a private IPv4 /24 by its network address is
// accepted as a requested subnet.
func TestCheckSubnet(t *testing.T) {
	for s, ok := range map[string]bool{
		"10.10.7.0/24": true, "172.16.3.0/24": true, "192.168.50.0/24": true,
		"8.8.8.0/24": false, "100.64.1.0/24": false, "10.10.7.5/24": false, "10.10.0.0/16": false,
		"10.10.7.0/25": false, "fd00::/64": false, "169.254.1.0/24": false, "127.0.0.0/24": false,
	} {
		if err := checkSubnet(netip.MustParsePrefix(s)); (err == nil) != ok {
			t.Errorf("checkSubnet(%s) = %v, want ok=%v", s, err, ok)
		}
	}
}
