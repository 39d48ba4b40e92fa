// Writes oclif.manifest.json, as `oclif manifest` does, without the oclif CLI (which brings the
// AWS SDK for publishing): with a manifest, oclif reads every command's flags and help from one
// JSON file instead of importing every command module at start-up.
import {writeFile} from 'node:fs/promises'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

import {Plugin} from '@oclif/core'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const plugin = new Plugin({root, type: 'core', ignoreManifest: true, errorOnManifestCreate: true, isRoot: true})
await plugin.load()
const file = path.join(root, 'oclif.manifest.json')
await writeFile(file, JSON.stringify(plugin.manifest, null, 2) + '\n')
console.log(`wrote ${path.relative(process.cwd(), file)} (${Object.keys(plugin.manifest.commands).length} commands)`)
