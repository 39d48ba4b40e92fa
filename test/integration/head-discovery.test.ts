// Discovery through Gym's head server: /server_instances lists each process under its top-level
// config key as process_name (and config_path); its `name` is the implementation key, which two
// servers of one implementation share (Gym's RunHelper.start fills them so).
import {describe, expect, it} from 'vitest'

import {HeadServer} from '../../src/control-plane/head.js'
import {readHeadServer} from '../../src/coordination/discover.js'
import {later} from '../helpers/fleet.js'

describe('head-server discovery', () => {
  it("matches each server on process_name, not on the implementation key another server's name shares", async () => {
    // Two resources servers of one implementation; the second's top-level key is that
    // implementation's name, and it comes second in the list.
    const head = new HeadServer([
      {name: 'b', kind: 'resources', url: 'http://127.0.0.1:41001'},
      {name: 'resources_impl', kind: 'resources', url: 'http://127.0.0.1:41002'},
    ])
    const url = await head.listen()
    later(() => head.close())
    const servers = await readHeadServer(url, 5000)
    expect(servers).toEqual([
      {name: 'b', url: 'http://127.0.0.1:41001'},
      {name: 'resources_impl', url: 'http://127.0.0.1:41002'},
    ])
  })
})
