import {execFile} from 'node:child_process'
import {readdir} from 'node:fs/promises'
import path from 'node:path'
import {fileURLToPath} from 'node:url'
import {promisify} from 'node:util'

import {describe, expect, it} from 'vitest'

import {checkpoint} from '../../src/coordination/controller.js'
import {FULL, coordinatorFor, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const run = promisify(execFile)
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..')
// The packed package runs on whatever Node is first on PATH: put this (pinned) one there.
const env = {...process.env, PATH: `${path.dirname(process.execPath)}${path.delimiter}${process.env.PATH}`, NO_COLOR: '1'}

describe('the published package', () => {
  it('packs only what runs, installs into an empty prefix, and runs --version and verify', async () => {
    const dir = await tempDir()
    // --ignore-scripts: dist/ and the manifest are fresh from `npm test`'s build; prepack would
    // rebuild dist/ under the other tests' feet.
    const packed = await run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', dir], {cwd: repo, env})
    const [info] = JSON.parse(packed.stdout) as [{filename: string; files: {path: string}[]}]
    const files = info.files.map((f) => f.path)
    expect(files).toEqual(expect.arrayContaining(['LICENSE', 'README.md', 'package.json', 'bin/run.js', 'oclif.manifest.json', 'dist/commands/verify.js', 'dist/storage/verify-worker.js']))
    expect(files.filter((f) => f.startsWith('src/') || f.startsWith('test/') || f.endsWith('.map') || f === 'bin/dev.js' || f.startsWith('bench/'))).toEqual([])

    const prefix = path.join(dir, 'prefix')
    await run('npm', ['install', '--prefix', prefix, '--prefer-offline', '--no-audit', '--no-fund', '--omit=dev', path.join(dir, info.filename)], {env, timeout: 120_000})
    // The pinned runtime is a devDependency of the project only.
    expect(await readdir(path.join(prefix, 'node_modules'))).not.toContain('node')
    const bin = path.join(prefix, 'node_modules', '.bin', 'gymckpt')
    const version = await run(bin, ['--version'], {env})
    expect(version.stdout).toMatch(/^gymckpt\/\d+\.\d+\.\d+ /)

    const fleet = await startFleet({members: FULL})
    const root = await tempDir()
    await checkpoint(await coordinatorFor(fleet), {root, timeoutS: 10, episodes: []})
    const verify = await run(bin, ['verify', root, '--json'], {env})
    expect(JSON.parse(verify.stdout)).toMatchObject({ok: true, valid: true})
  }, 180_000)
})
