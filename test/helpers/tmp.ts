import {mkdtemp, rm} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {afterEach} from 'vitest'

const dirs: string[] = []

/** A real temp directory, removed after the test. */
export async function tempDir(prefix = 'gymckpt-test-'): Promise<string> {
  const d = await mkdtemp(path.join(os.tmpdir(), prefix))
  dirs.push(d)
  return d
}

afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, {recursive: true, force: true})))
})
