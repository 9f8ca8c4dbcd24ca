// Loopback ports for a test's own servers, the way tests/support/free_port.h draws them: at random
// from the 15,000 ports below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range),
// kept when both TCP and UDP can bind it, so no client socket on the host (another program's bind
// to port 0, a resolver's query, a TCP connect) can be handed it between the probe and the
// server's bind. Ports this process got are never handed out again.
import dgram from 'node:dgram';
import fs from 'node:fs';
import net from 'node:net';

const given = new Set();

function ephemeralLow() {
  try {
    const low = Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').split(/\s+/)[0]);
    return low > 2048 ? low : 32768;
  } catch {
    return 32768;
  }
}

function tcpBindable(port) {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

function udpBindable(port) {
  return new Promise((resolve) => {
    const s = dgram.createSocket('udp4');
    s.once('error', () => {
      s.close();
      resolve(false);
    });
    s.bind(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

export async function freePort() {
  const high = ephemeralLow();
  const low = high > 16025 ? high - 15000 : 1025;
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = low + Math.floor(Math.random() * (high - low));
    if (given.has(port)) continue;
    if ((await tcpBindable(port)) && (await udpBindable(port))) {
      given.add(port);
      return port;
    }
  }
  throw new Error('no free loopback port below the ephemeral range after 200 draws');
}

export async function freePorts(n) {
  const ports = [];
  for (let i = 0; i < n; i++) ports.push(await freePort());
  return ports;
}
