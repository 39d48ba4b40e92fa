import http from 'node:http'
import type {AddressInfo} from 'node:net'

/** A port on 127.0.0.1 that nothing listens on (it was listened on and closed). */
export async function freePort(): Promise<number> {
  const s = http.createServer()
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()))
  const port = (s.address() as AddressInfo).port
  await new Promise((r) => s.close(r))
  return port
}
