// Colour for human output (src/cli/color.ts): the flag beats the environment, and otherwise the
// decision is Node's own (tty.WriteStream.hasColors for a terminal, FORCE_COLOR for anything else).
import {describe, expect, it} from 'vitest'

import {closeSync, openSync, unlinkSync} from 'node:fs'
import os from 'node:os'
import path from 'node:path'

import {colorFlag, platformColors, styler, terminalStream} from '../../src/cli/color.js'

/** A stand-in for a stream: a terminal with the colour support `colors` answers, or a pipe. */
function stream(tty: false | ((count?: number, env?: object) => boolean)): NodeJS.WriteStream {
  return (tty === false ? {isTTY: false} : {isTTY: true, hasColors: tty}) as unknown as NodeJS.WriteStream
}

describe('colorFlag', () => {
  it('reads the last --color / --no-color before --, and nothing else', () => {
    expect(colorFlag([])).toBeUndefined()
    expect(colorFlag(['verify', '/r'])).toBeUndefined()
    expect(colorFlag(['verify', '--color'])).toBe(true)
    expect(colorFlag(['--no-color', 'verify'])).toBe(false)
    expect(colorFlag(['--color', '--no-color'])).toBe(false)
    expect(colorFlag(['--no-color', '--color'])).toBe(true)
    expect(colorFlag(['--', '--color'])).toBeUndefined()
    expect(colorFlag(['--color', '--', '--no-color'])).toBe(true)
    expect(colorFlag(['--colors', '--color=false', '-color'])).toBeUndefined()
  })
})

describe('terminalStream', () => {
  it('opens the stream only for a character device: a file, a pipe or a closed descriptor is no terminal', () => {
    let opened = 0
    const open = () => (opened++, stream(() => true))
    const name = path.join(os.tmpdir(), `gymckpt-color-${process.pid}`)
    const file = openSync(name, 'w')
    const devNull = openSync('/dev/null', 'w')
    try {
      expect(terminalStream(file, open)).toBeUndefined()
      expect(opened).toBe(0)
      // /dev/null is a character device: it may be a terminal, so the stream is asked.
      expect(terminalStream(devNull, open)).toBeDefined()
      expect(opened).toBe(1)
    } finally {
      closeSync(file)
      closeSync(devNull)
      unlinkSync(name)
    }
    expect(terminalStream(2 ** 30, open)).toBeUndefined()
    expect(opened).toBe(1)
    expect(platformColors(() => undefined, {})).toBe(false)
  })
})

describe('platformColors', () => {
  it('asks a terminal (with the environment) whether it shows 16 colours', () => {
    const asked: unknown[][] = []
    const env = {TERM: 'xterm'}
    expect(platformColors(() => stream((...a) => (asked.push(a), true)), env)).toBe(true)
    expect(asked).toEqual([[16, env]])
    expect(platformColors(() => stream(() => false), {})).toBe(false)
    expect(platformColors(() => stream(false), {})).toBe(false)
  })

  it('colours a pipe or a file only when FORCE_COLOR asks for 16 colours or more', () => {
    for (const force of ['', '1', 'true', '2', '3'])
      expect(
        platformColors(() => stream(false), {FORCE_COLOR: force}),
        `FORCE_COLOR=${force}`,
      ).toBe(true)
    for (const force of [undefined, '0', 'false', '4', 'yes'])
      expect(
        platformColors(() => stream(false), {FORCE_COLOR: force}),
        `FORCE_COLOR=${force}`,
      ).toBe(false)
  })

  it("decides what the environment decides without opening the stream, in Node's order", () => {
    const untouched = () => {
      throw new Error('the stream was opened')
    }
    expect(platformColors(untouched, {FORCE_COLOR: '1', NO_COLOR: '1'})).toBe(true)
    expect(platformColors(untouched, {FORCE_COLOR: '0', TERM: 'xterm-256color'})).toBe(false)
    expect(platformColors(untouched, {NO_COLOR: '1'})).toBe(false)
    expect(platformColors(untouched, {NODE_DISABLE_COLORS: '1'})).toBe(false)
    expect(platformColors(untouched, {TERM: 'dumb'})).toBe(false)
    // Empty NO_COLOR and NODE_DISABLE_COLORS do not count (no-color.org; tty.getColorDepth).
    expect(platformColors(() => stream(() => true), {NO_COLOR: '', NODE_DISABLE_COLORS: ''})).toBe(true)
  })
})

describe('styler', () => {
  it('wraps text in SGR codes when on', () => {
    const c = styler(() => stream(false), true)
    expect([c.bold('b'), c.dim('d'), c.red('r'), c.green('g'), c.yellow('y')]).toEqual([
      '\u001b[1mb\u001b[22m',
      '\u001b[2md\u001b[22m',
      '\u001b[31mr\u001b[39m',
      '\u001b[32mg\u001b[39m',
      '\u001b[33my\u001b[39m',
    ])
  })

  it('leaves text alone when off, whatever the stream', () => {
    const c = styler(() => stream(() => true), false)
    expect([c.bold('b'), c.dim('d'), c.red('r'), c.green('g'), c.yellow('y')]).toEqual(['b', 'd', 'r', 'g', 'y'])
  })

  it('without the flag, asks its own stream once, on first use', () => {
    let asked = 0
    const c = styler(() => (asked++, stream(() => true)), undefined)
    expect(asked).toBe(0)
    expect(c.red('x')).toBe('\u001b[31mx\u001b[39m')
    expect(c.green('y')).toBe('\u001b[32my\u001b[39m')
    expect(asked).toBe(1)
  })
})
