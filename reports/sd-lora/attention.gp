# vramlab report: gnuplot attention.gp in this folder re-renders attention.png
if (!exists("vl_png")) vl_png = 'attention.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Classic vs efficient attention: peak memory vs batch (rung after, planned)'
set xlabel 'micro-batch'
set ylabel 'GB'
set grid
set key left top
set logscale y
plot 'attn_classic.dat' using 1:2 with linespoints lw 2 pt 7 title 'classic (scores materialised)', 'attn_efficient.dat' using 1:2 with linespoints lw 2 pt 5 title 'efficient (tiled)', 22.6774 with lines lw 2 lc rgb 'red' title 'cap, 24 GB card', 45.3549 with lines lw 2 dt 2 lc rgb 'red' title 'cap, 48 GB card'
