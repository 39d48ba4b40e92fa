export * from './episode.js'
export * from './errors.js'
export * from './wire.js'
