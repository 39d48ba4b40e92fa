// sha256Hasher's choice for a big input in a fresh process (module instance): node:crypto at
// once, without spending the JavaScript budget; and an input just over the budget is not JS's.
import {describe, expect, it} from 'vitest'

import {JS_HASH_BUDGET, Sha256, sha256Hasher} from '../../src/storage/sha256.js'

describe('sha256Hasher, a big input first', () => {
  it('goes to node:crypto for an input over the budget, and then for every input', async () => {
    expect(await sha256Hasher(JS_HASH_BUDGET + 1)).not.toBeInstanceOf(Sha256)
    // node:crypto is loaded now: a small input gains nothing from JavaScript any more.
    expect(await sha256Hasher(10)).not.toBeInstanceOf(Sha256)
  })
})
