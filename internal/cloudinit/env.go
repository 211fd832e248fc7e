package cloudinit

// ProxyEnvironment is the proxy and CA environment the guest's shells and
// services get from the seed, for host-side code that runs commands in the
// guest (provisioning) and must give them the same settings.
func ProxyEnvironment(c Config) [][2]string { return proxyEnv(c) }
